"""Zep's open engine (graphiti-core 0.31.2 over a Kùzu file), as Zep's LoCoMo row.

The worker (systems/workers/zep_worker.py) feeds a conversation the way Zep's LoCoMo harness
in mem0's evaluation (evaluation/src/zep/add.py, search.py) feeds Zep Cloud, with graphiti's
open API in its place: one graph partition per conversation, one episode per message
("<speaker>(user): <session date>: <text>", as graphiti's own REST server turns a Zep-style
message into an episode) with the session's date as the reference time; search returns the
top-k facts (hybrid search reranked by graphiti's cross-encoder, one logprob call per candidate)
and the top-k entities (hybrid search, RRF) per question. Differences from that harness: Zep
Cloud is a hosted service whose server side is not released; we run the released engine with
its default prompts, and the harness used k = 20 where the papers report top-10.

`scripted_reply` answers graphiti's own prompts without a model (unit tests, the CI tier): the
prompt is recognised by the schema name of its `json_schema` response format (graphiti sends
one with every call) or, failing that, by its tags; entities are the speaker and the message's
capitalised words, facts link the speaker to each, nothing is a duplicate unless its text is
the same, and the reranker's True/False comes with logprobs from word overlap.
Standard library only: this module is imported by our package, not by the worker.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

VERSION = "0.31.2"
REQUIREMENTS = ("graphiti-core[kuzu]==0.31.2", "kuzu==0.11.3",
                # imported by graphiti_core.llm_client.client, not declared (openai 3.x
                # depends on httpx2)
                "httpx==0.29.0")
ENV = {
    "GRAPHITI_TELEMETRY_ENABLED": "false",  # PostHog: off (the worker forces it too)
}

_FACT_WORDS = 12
_MAX_ENTITIES = 4
_STOP = frozenset([
    "I", "I'm", "I've", "I'd", "I'll", "It", "It's", "The", "A", "An", "And", "But", "So", "Oh",
    "Yes", "No", "Hi", "Hey", "Wow", "That", "This", "What", "When", "Where", "Why", "How", "Who",
    "Which", "Do", "Did", "Does", "Are", "Is", "Was", "Were", "Have", "Has", "Had", "My", "Me",
    "We", "You", "Your", "Our", "They", "Thanks", "Thank", "Sure", "Well", "Really", "Just",
    "Hello", "Hope", "Glad", "Great", "Nice", "Good", "Cool", "Awesome", "Sounds", "Haha", "Lol",
    "Also", "Yeah", "Totally", "Definitely", "Absolutely", "Let", "Can", "Could", "Would",
    "Should", "Will", "Not", "Any", "All", "Some", "January", "February", "March", "April", "May",
    "June", "July", "August", "September", "October", "November", "December", "Monday", "Tuesday",
    "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "He", "She", "His", "Her", "Here",
    "There", "Those", "These", "Don't", "Maybe", "That's", "You're", "Big", "If", "Or",
])
_STOP_LOWER = frozenset(w.lower() for w in _STOP)
# "<Speaker>(<role type>): " then LoCoMo's "<h:mm am/pm> on <d Month, yyyy>: " (the worker's body)
_SPEAKER = re.compile(r"^\s*([^:(\n]{1,60}?)\s*(?:\([^)\n]*\))?:\s*(.*)$", re.DOTALL)
_DATE = re.compile(r"^\d{1,2}:\d{2}\s*[ap]m on \d{1,2} \w+,? \d{4}:\s*", re.IGNORECASE)


def _between(text: str, tag: str) -> str | None:
    m = re.search(rf"<{re.escape(tag)}>\s*\n?(.*?)\n?\s*</{re.escape(tag)}>", text, re.DOTALL)
    return m.group(1).strip() if m else None


def _json(block: str | None) -> Any:
    if not block:
        return []
    try:
        return json.loads(block)
    except ValueError:
        try:
            return ast.literal_eval(block)  # graphiti writes some lists with Python's str()
        except (ValueError, SyntaxError):
            return []


def _message(block: str | None) -> tuple[str, str]:
    """(speaker, text) of an episode body."""
    body = (block or "").strip()
    m = _SPEAKER.match(body)
    if not m:
        return "", body
    return m.group(1).strip(), _DATE.sub("", m.group(2).strip())


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z][\w'-]*", text)


def _entities(speaker: str, text: str) -> list[str]:
    """The speaker, capitalised words of the text, else its longest word (one fact at least)."""
    names = [speaker] if speaker else []
    caps = [w for w in re.findall(r"\b(?:[A-Z][a-z][\w'-]*|[A-Z]{2,}[\w'-]*)", text)
            if w not in _STOP]
    names += caps
    if len(names) < 2:
        long = sorted((w.lower() for w in _words(text) if len(w) >= 4 and w not in _STOP),
                      key=len, reverse=True)
        names += long[:1]
    seen: dict[str, str] = {}
    for n in names:
        seen.setdefault(n.lower(), n)
    return list(seen.values())[:_MAX_ENTITIES]


def _iso_z(value: str | None) -> str | None:
    """graphiti's REFERENCE_TIME ("2023-05-08 13:56:00+00:00  # ...") as ISO with Z."""
    if not value:
        return None
    m = re.search(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})", value)
    return f"{m.group(1)}T{m.group(2)}Z" if m else None


def _extracted_entities(prompt: str) -> dict[str, Any]:
    speaker, text = _message(_between(prompt, "CURRENT MESSAGE"))
    return {"extracted_entities": [{"name": n, "entity_type_id": 0, "episode_indices": [0]}
                                   for n in _entities(speaker, text)]}


def _node_resolutions(prompt: str) -> dict[str, Any]:
    new = [e for e in _json(_between(prompt, "ENTITIES")) if isinstance(e, Mapping)]
    old = [e for e in _json(_between(prompt, "EXISTING ENTITIES")) if isinstance(e, Mapping)]
    by_name = {str(e.get("name", "")).lower(): int(e.get("candidate_id", -1)) for e in old}
    return {"entity_resolutions": [
        {"id": int(e.get("id", i)), "name": str(e.get("name", "")),
         "duplicate_candidate_id": by_name.get(str(e.get("name", "")).lower(), -1)}
        for i, e in enumerate(new)]}


def _extracted_edges(prompt: str) -> dict[str, Any]:
    speaker, text = _message(_between(prompt, "CURRENT_MESSAGE"))
    names = [str(e.get("name")) for e in _json(_between(prompt, "ENTITIES"))
             if isinstance(e, Mapping) and e.get("name")]
    if not names:
        return {"edges": []}
    source = next((n for n in names if n.lower() == speaker.lower()), names[0])
    when = _iso_z(_between(prompt, "REFERENCE_TIME"))
    gist = " ".join(_words(text)[:_FACT_WORDS])
    return {"edges": [
        {"source_entity_name": source, "target_entity_name": other,
         "relation_type": "MENTIONED", "fact": f"{source} mentioned {other}: {gist}",
         "valid_at": when, "invalid_at": None, "episode_indices": [0]}
        for other in names if other != source]}


def _edge_duplicate(prompt: str) -> dict[str, Any]:
    new = (_between(prompt, "NEW FACT") or "").strip()
    old = [f for f in _json(_between(prompt, "EXISTING FACTS")) if isinstance(f, Mapping)]
    return {"duplicate_facts": [int(f["idx"]) for f in old
                                if str(f.get("fact", "")).strip() == new and "idx" in f],
            "contradicted_facts": []}


def _summaries(prompt: str) -> dict[str, Any]:
    """Each entity's summary, cut to its last lines under 900 characters (graphiti asks for a
    shorter one when the facts appended to a summary pass 2,000 characters)."""
    out = []
    for e in _json(_between(prompt, "ENTITIES")):
        if not isinstance(e, Mapping) or not e.get("name"):
            continue
        lines, size = [], 0
        for line in reversed(str(e.get("summary") or "").splitlines()):
            if size + len(line) > 900:
                break
            lines.insert(0, line)
            size += len(line) + 1
        out.append({"name": str(e["name"]), "summary": "\n".join(lines) or str(e["name"])})
    return {"summaries": out}


def _rerank(prompt: str) -> dict[str, Any]:
    """True/False with top logprobs: p(True) = word overlap of PASSAGE and QUERY, smoothed. The
    logprobs ride in the message (the front's scripted replies set message fields); the worker
    lifts them to the choice, where graphiti reads them."""
    passage = {w.lower() for w in _words(_between(prompt, "PASSAGE") or "")}
    query = {w.lower() for w in _words(_between(prompt, "QUERY") or "")
             if len(w) > 2 and w.lower() not in _STOP_LOWER}
    p = (1 + len(query & passage)) / (2 + len(query))
    token = "True" if p >= 0.5 else "False"
    lp_top = math.log(p if token == "True" else 1 - p)
    lp_other = math.log(1 - p if token == "True" else p) if 0 < p < 1 else -100.0
    other = "False" if token == "True" else "True"
    top = [{"token": token, "logprob": lp_top, "bytes": None},
           {"token": other, "logprob": lp_other, "bytes": None}]
    return {"content": token, "logprobs": {"content": [
        {"token": token, "logprob": lp_top, "bytes": None, "top_logprobs": top}]}}


_BY_SCHEMA = {
    "ExtractedEntities": _extracted_entities,
    "NodeResolutions": _node_resolutions,
    "ExtractedEdges": _extracted_edges,
    "EdgeDuplicate": _edge_duplicate,
    "SummarizedEntities": _summaries,
    "EdgeTimestamps": lambda p: {"valid_at": _iso_z(_between(p, "REFERENCE TIME")),
                                 "invalid_at": None},
    "Summary": lambda p: {"summary": "A scripted summary."},
    "EntitySummary": lambda p: {"summary": "A scripted summary."},
    "SummaryDescription": lambda p: {"description": "A scripted description."},
}
# The same prompts by their tags, for a body without a schema name.
_BY_TAGS = (
    ("<CURRENT MESSAGE>", "<ENTITY TYPES>", "ExtractedEntities"),
    ("<EXISTING ENTITIES>", "<ENTITIES>", "NodeResolutions"),
    ("<CURRENT_MESSAGE>", "<REFERENCE_TIME>", "ExtractedEdges"),
    ("<NEW FACT>", "<EXISTING FACTS>", "EdgeDuplicate"),
    ("<FACT>", "<REFERENCE TIME>", "EdgeTimestamps"),
    ("<MESSAGES>", "<ENTITIES>", "SummarizedEntities"),
)


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of graphiti's chat bodies (see the module docstring)."""
    messages = body.get("messages") or []
    prompt = "\n".join(str(m.get("content") or "") for m in messages if isinstance(m, Mapping))
    if body.get("logprobs") and "<PASSAGE>" in prompt:
        return _rerank(prompt)
    fmt = body.get("response_format") or {}
    name = str((fmt.get("json_schema") or {}).get("name") or "") if isinstance(fmt, Mapping) else ""
    if name not in _BY_SCHEMA:
        name = next((n for a, b, n in _BY_TAGS if a in prompt and b in prompt), "")
    answer = _BY_SCHEMA.get(name)
    return {"content": json.dumps(answer(prompt) if answer else {})}


SPEC = SystemSpec(
    name="zep",
    title="Zep (open engine: graphiti-core)",
    requirements=REQUIREMENTS,
    worker="zep_worker.py",
    source=f"pypi:graphiti-core=={VERSION}",
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="top-10 facts and top-10 entities per question from one graph per "
                   "conversation (StructMem A.4: Zep top-10; Zep's harness in mem0's "
                   "evaluation: 20 of each)",
)
