"""A-MEM (Xu et al., "A-MEM: Agentic Memory for LLM Agents"): its LoCoMo experiment code, a
repository release (no package), pinned at commit 0c8039f of its repository.

`python jobs/data.py systems install amem` installs the lock (locks/amem.txt: openai, numpy,
scikit-learn, rank-bm25, nltk, requests, tqdm; no torch) and exports the pinned commit's tree
from paths.official_dir/amem.git into `<env>/src`; the worker
(systems/workers/amem_worker.py) imports A-MEM's `memory_layer` and its LoCoMo driver's agent
(`test_advanced.advancedMemAgent`) from there and feeds a conversation as that driver does:
every turn one note ("Speaker <name>says : <text>", the session's date), each note an analysis
call (keywords, context, tags) and an evolution call (links to, and updates of, its 5 nearest
notes); a question is the driver's keyword-generation call, then the retriever's top-k for
those keywords plus the notes they link to. A-MEM's embedder (SentenceTransformer
'all-MiniLM-L6-v2', hard-coded) is replaced by the job's encoder behind the front, as every
system's embeddings are; what the build and search never call (transformers, litellm, A-MEM's
metrics module) is not installed. See the worker's docstring for the missing `import re` of the
pinned commit (restored by default: `restore_missing_import`).

Paper settings: SEEM §5.1 retrieves A-MEM's top-10 (conf/method/amem.yaml: system.top_k 10,
the rows on file); StructMem Appendix A.4 uses top-40 (`system.top_k=40`).

`scripted_reply` answers A-MEM's requests without a model (unit tests): each is told by its
JSON-schema response_format (the properties it asks for), not by prompt text.
Standard library only: this module is imported by our package, not by the worker.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

COMMIT = "0c8039f"
REQUIREMENTS = ("openai==3.60.0", "nltk==3.10.4", "rank-bm25==0.2.2", "scikit-learn==1.9.1",
                "numpy==2.4.6", "requests==2.34.2", "tqdm==4.70.1")

_STOP = frozenset([
    "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "did", "do",
    "does", "for", "from", "had", "has", "have", "he", "her", "his", "how", "i", "i'm",
    "i've", "it", "it's", "its", "just", "me", "my", "of", "on", "or", "our", "she", "so",
    "that", "the", "their", "them", "then", "there", "they", "this", "to", "too", "was",
    "we", "were", "what", "when", "where", "which", "who", "why", "will", "with", "you",
    "your", "yeah", "yes", "about", "really", "that's", "what's", "don't", "oh", "hey",
    "wow", "thanks", "thank", "sure", "well", "also", "very", "much",
])
_NOTE = re.compile(r"Speaker (.+?)says : ")


def _schema_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    return dict(schema.get("properties") or {})


def _user_text(body: Mapping[str, Any]) -> str:
    return "\n".join(str(m.get("content") or "") for m in body.get("messages") or []
                     if isinstance(m, Mapping) and m.get("role") == "user")


def _words(text: str, n: int) -> list[str]:
    out: dict[str, None] = {}
    for w in re.findall(r"[A-Za-z][A-Za-z'-]+", text):
        w = w.lower().strip("'-")
        if len(w) >= 4 and w not in _STOP:
            out.setdefault(w, None)
    return list(out)[:n]


def _last_note(text: str) -> tuple[str, str]:
    """(speaker, text) of the last note content in a prompt (the one being analysed)."""
    found = list(_NOTE.finditer(text))
    if not found:
        return "", text.strip()
    m = found[-1]
    return m.group(1), text[m.end():].strip()


def _literal(text: str | None) -> Any:
    try:
        return ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError):
        return None


def _analysis(prompt: str) -> dict[str, Any]:
    speaker, said = _last_note(prompt)
    keywords = _words(said, 4) or ["chat"]
    context = f"{speaker or 'Someone'} talks about {' '.join(said.split()[:6])}".strip()
    return {"keywords": keywords, "context": context,
            "tags": ["conversation", *([speaker.lower()] if speaker else []), keywords[0]]}


def _evolution(prompt: str) -> dict[str, Any]:
    """Link the new note to its nearest neighbour and tag that neighbour "linked"."""
    indices = [int(i) for i in re.findall(r"memory index:(\d+)", prompt)]
    if not indices:
        return {"should_evolve": False, "actions": [], "suggested_connections": [],
                "tags_to_update": [], "new_context_neighborhood": [],
                "new_tags_neighborhood": []}
    kw = re.search(r"keywords: (\[.*?\])\s*\n", prompt)
    keywords = [str(x) for x in (_literal(kw.group(1)) if kw else None) or []]
    first = prompt[prompt.find("memory index:"):]
    ctx = re.search(r"memory context: (.*?)\t memory keywords", first)
    tags = re.search(r"memory tags: (\[.*?\])\s*\n", first)
    old_tags = [str(x) for x in (_literal(tags.group(1)) if tags else None) or []]
    return {"should_evolve": True, "actions": ["strengthen", "update_neighbor"],
            "suggested_connections": [indices[0]],
            "tags_to_update": ["conversation", *keywords[:2]],
            "new_context_neighborhood": [ctx.group(1) if ctx else "General"],
            "new_tags_neighborhood": [[*old_tags, *([] if "linked" in old_tags else ["linked"])]]}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of A-MEM's chat bodies (see the module docstring)."""
    keys = _schema_keys(body)
    text = _user_text(body)
    if {"keywords", "context", "tags"} <= keys.keys():  # MemoryNote.analyze_content
        reply: dict[str, Any] = _analysis(text)
    elif "should_evolve" in keys:  # AgenticMemorySystem.process_memory
        reply = _evolution(text)
    elif set(keys) == {"keywords"}:  # the driver's generate_query_llm
        q = re.search(r"Question: (.*)", text)
        reply = {"keywords": ", ".join(_words(q.group(1) if q else text, 6))}
    elif "answer" in keys:  # the driver's answer prompts (our reader answers instead)
        reply = {"answer": "Not mentioned in the conversation"}
    elif "relevant_parts" in keys:
        reply = {"relevant_parts": ""}
    else:
        reply = {}
    return {"content": json.dumps(reply)}


SPEC = SystemSpec(
    tier="heavy",  # repository code with its own model stack: the heavy tier
    name="amem",
    title="A-MEM",
    requirements=REQUIREMENTS,
    worker="amem_worker.py",
    source=f"git:amem.git@{COMMIT}",
    repository=("amem.git", COMMIT),
    scripted_reply=scripted_reply,
    paper_settings="top-10 notes per question by the LLM's query keywords, each with the notes "
                   "it links to (SEEM §5.1: top-10; StructMem A.4: top-40, system.top_k=40)",
    options={"restore_missing_import": True},
)
