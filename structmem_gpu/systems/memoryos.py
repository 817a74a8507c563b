"""MemoryOS (Kang et al., "Memory OS of AI Agent", BAI-LAB): its LoCoMo evaluation code (the
repository's `eval/`, no package, no requirements file), pinned at commit 1d71706.

`python jobs/data.py systems install memoryos` installs the lock (locks/memoryos.txt: openai,
numpy, faiss-cpu, tiktoken; no torch, no sentence-transformers) and exports the pinned commit's
tree from paths.official_dir/memoryos.git into `<env>/src`; the worker
(systems/workers/memoryos_worker.py) imports MemoryOS's memory modules and its LoCoMo driver
(`eval/main_loco_parse.py`) from `src/eval` and feeds a conversation as that driver does: the
turns paired into pages (a speaker_a turn with the speaker_b turn after it, the session's
LoCoMo date), each page through a short-term memory of capacity 1, so every page is evicted at
once into the mid-term memory (continuity check, meta-summary, topic summary, then merged into
the closest segment or a new one, with keyword calls), and a hot segment (heat >= 5) analysed
into the long-term persona memory (user profile, user facts, assistant knowledge). A question is
MemoryOS's retrieval (`RetrievalAndAnswer.retrieve` with the driver's thresholds 0.1): what the
driver's answer prompt shows becomes the hits; our reader answers, not MemoryOS's.

Paper settings: StructMem Appendix A.4 retrieves, for MemoryOS, the short-term memory whole,
5 mid-term segments and 10 pages from them, and the 10 best long-term persona (user knowledge)
entries, which are also the defaults of MemoryOS's driver: `system.top_k` 10 (pages, the
driver's queue_capacity) and `system.options` segments 5, knowledge 10 (conf/method/memoryos.yaml;
StructMem Table 1 "MemoryOS").

MemoryOS hard-codes `OpenAI(base_url='https://...')` at import and `gpt-4o-mini` per call, and
builds `SentenceTransformer('all-MiniLM-L6-v2')` per embedding: the worker points every client
at the front and serves every embedding from the job's encoder (see its docstring).

`scripted_reply` answers MemoryOS's requests without a model (unit tests, debug=scripted). Its
chat bodies carry no schema or tools (only messages, temperature, max_tokens), so each request is
told by a short marker of its system message (the role each prompt gives the model), never by
the long prompt text. Standard library only: this module is imported by our package, not by
the worker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

COMMIT = "1d71706"
REQUIREMENTS = ("openai==3.60.0", "numpy==2.4.6", "faiss-cpu==1.15.1", "tiktoken==0.14.0")

# What each of MemoryOS's system messages says it is (eval/utils.py, eval/dynamic_update.py at
# the pinned commit): a few words each, matched case-insensitively.
_CONTINUITY = "continuity detector"  # DynamicUpdate._is_conversation_continuing
_META = "meta-summary updater"  # DynamicUpdate._generate_meta_info
_THEMES = "analyzing dialogue topics"  # gpt_generate_multi_summary
_KEYWORDS = "keyword extraction"  # llm_extract_keywords
_PERSONA = "personality and user data"  # gpt_personality_analysis
_ASSISTANT = "assistant knowledge extraction"  # analyze_assistant_knowledge
_MERGE = "profile integration"  # gpt_update_profile
# The section marker MemoryOS splits a persona reply at (its parser, not prompt text).
USER_DATA = "\u3010User Data\u3011"
ASSISTANT_KNOWLEDGE = "\u3010Assistant Knowledge\u3011"
# A theme every scripted topic summary and keyword reply shares, so pages of one conversation
# merge into one segment (MemoryOS merges on summary similarity plus keyword overlap) and the
# segment grows hot enough for the persona analysis.
THEME = "daily life"

_STOP = frozenset([
    "about", "also", "and", "are", "been", "but", "can", "did", "does", "for", "from", "had",
    "has", "have", "her", "his", "how", "i'm", "i've", "it's", "its", "just", "much", "our",
    "she", "so", "that", "that's", "the", "their", "them", "then", "there", "they", "this",
    "too", "was", "were", "what", "what's", "when", "where", "which", "who", "why", "will",
    "with", "you", "your", "yeah", "yes", "really", "don't", "hey", "wow", "thanks", "thank",
    "sure", "well", "very", "user", "assistant", "assiant", "none",
])


def _words(text: str, n: int) -> list[str]:
    out: dict[str, None] = {}
    for w in re.findall(r"[A-Za-z][A-Za-z'-]+", text):
        w = w.lower().strip("'-")
        if len(w) >= 4 and w not in _STOP:
            out.setdefault(w, None)
    return list(out)[:n]


def _messages(body: Mapping[str, Any]) -> tuple[str, str]:
    system, user = [], []
    for m in body.get("messages") or []:
        if isinstance(m, Mapping):
            (system if m.get("role") == "system" else user).append(str(m.get("content") or ""))
    return "\n".join(system), "\n".join(user)


def _said(text: str, who: str = "User") -> list[str]:
    """The `<who>: ...` lines of a prompt's dialogue, in order."""
    return [m.group(1).strip() for m in re.finditer(rf"^\s*{who}: ?(.*)$", text, re.MULTILINE)
            if m.group(1).strip()]


def _dialogue(prompt: str) -> str:
    """The conversation a persona prompt ends with (after its few-shot examples)."""
    return prompt.rsplit("Conversation:", 1)[-1]


def _continuity(prompt: str) -> str:
    """"true" when the two pages share a content word."""
    prev = prompt.partition("Previous Page:")[2].partition("Current Page:")[0]
    cur = prompt.partition("Current Page:")[2].partition("Continuous?")[0]
    return "true" if set(_words(prev, 50)) & set(_words(cur, 50)) else "false"


def _meta(prompt: str) -> str:
    new = prompt.rsplit("New Dialogue:", 1)[-1].split("Updated Meta-summary", 1)[0]
    words = _words(new, 4) or ["small talk"]
    return f"They talk about {', '.join(words)}."


def _themes(prompt: str) -> str:
    said = " ".join(_said(prompt.rsplit("Conversation content:", 1)[-1]))
    words = _words(said, 2)
    content = f"The user talks about {' '.join(said.split()[:8])}".strip()
    return json.dumps([{"theme": THEME.title(), "keywords": [THEME, *words], "content": content}])


def _keywords(prompt: str) -> str:
    text = prompt.split(":", 1)[-1]
    return ", ".join([THEME, *_words(text, 2)])


def _persona(prompt: str) -> str:
    said = _said(_dialogue(prompt))
    topics = _words(" ".join(said), 3) or ["conversation"]
    facts = [f"- User said: {' '.join(s.split()[:12])}" for s in said[:5]] or ["None."]
    return ("\u3010User Profile\u3011\n1. Core Psychological Traits:\n   - Open: Positive "
            f"(talks about {topics[0]})\n2. Content Preferences:\n"
            + "".join(f"   - {t}: Like\n" for t in topics)
            + f"\n{USER_DATA}\n" + "\n".join(facts))


def _assistant(prompt: str) -> str:
    said = _said(_dialogue(prompt), "AI")
    if not said:
        return f"{ASSISTANT_KNOWLEDGE}\n- None"
    return f"{ASSISTANT_KNOWLEDGE}\n- I said: {' '.join(said[0].split()[:12])}"


def _merge(prompt: str) -> str:
    """The new analysis as the merged profile (the scripted merge keeps the newest)."""
    m = re.search(r"## New Data\s*\n(.*?)\n\s*## Rules", prompt, re.DOTALL)
    return (m.group(1) if m else prompt).strip() or "None"


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of MemoryOS's chat bodies (see the module docstring)."""
    system, prompt = _messages(body)
    role = system.lower()
    if _CONTINUITY in role:
        content = _continuity(prompt)
    elif _META in role:
        content = _meta(prompt)
    elif _THEMES in role:
        content = _themes(prompt)
    elif _KEYWORDS in role:
        content = _keywords(prompt)
    elif _PERSONA in role:
        content = _persona(prompt)
    elif _ASSISTANT in role:
        content = _assistant(prompt)
    elif _MERGE in role:
        content = _merge(prompt)
    else:  # the driver's answer prompt and the unused summaries (our reader answers)
        content = "Not mentioned in the conversation"
    return {"content": content}


SPEC = SystemSpec(
    tier="heavy",  # repository code run from its own driver: the heavy tier, as A-MEM
    name="memoryos",
    title="MemoryOS",
    requirements=REQUIREMENTS,
    worker="memoryos_worker.py",
    source=f"git:memoryos.git@{COMMIT}",
    repository=("memoryos.git", COMMIT),
    scripted_reply=scripted_reply,
    paper_settings="short-term memory whole + mid-term 5 segments / top-10 pages + long-term "
                   "persona memory top-10 per question (StructMem A.4; MemoryOS's LoCoMo driver "
                   "defaults: system.top_k 10 pages, system.options segments 5, knowledge 10)",
    # segments: mid-term segments searched (search_sessions_by_summary top_k); knowledge:
    # long-term user-knowledge entries (search_knowledge top_k); short_term_capacity: the
    # driver's ShortTermMemory(max_capacity=1), every page evicted at once.
    options={"segments": 5, "knowledge": 10, "short_term_capacity": 1},
)
