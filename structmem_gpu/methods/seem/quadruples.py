"""Quadruple extraction and fact normalisation for the graph memory layer
(docs/methods.md "SEEM: graph memory layer").

One request per passage (or per `seem.passages_per_request` passages of one session), all
conversations in one batch (stage `graph`). Subjects, relations and objects are normalised
as in HippoRAG 2 (lower case, everything outside [a-z0-9 ] becomes a space); facts are
deduplicated on (s, r, o, tau) per conversation with the union of their provenance:

    >>> normalise("Lena's  half-marathon!")
    'lena s half marathon'
    >>> fact_text("lena", "signed up for", "riverside half marathon", "2024-05-18")
    'lena signed up for riverside half marathon (time: 2024-05-18)'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.seem.passages import Passage
from structmem_gpu.methods.seem.settings import GraphSettings
from structmem_gpu.methods.seem.prompts import quadruples as seem_quadruples

STAGE_NAME = "graph"
_NON_ALNUM = re.compile(r"[^a-z0-9 ]")
_SPACES = re.compile(r"\s+")
_NO_TIME = frozenset({"", "?", "null", "none", "n/a", "unknown"})


@dataclass(frozen=True)
class Quad:
    s: str
    r: str
    o: str
    tau: str | None
    shown: str = ""  # the quadruple in the model's original words (what the reader sees)


@dataclass(frozen=True)
class Fact:
    fact_id: str
    conv_id: str
    s: str
    r: str
    o: str
    tau: str | None
    provenance: tuple[str, ...]  # pids, chronological
    request_ids: tuple[str, ...]
    shown: str = ""  # first original wording: "Subject | relation | Object | time"

    @property
    def text(self) -> str:
        return fact_text(self.s, self.r, self.o, self.tau)


@dataclass
class ExtractionCounts:
    quadruples: int = 0  # valid items returned
    malformed: int = 0  # items dropped by cleaning
    parse_failures: int = 0
    truncated: int = 0
    passages_without_facts: int = 0
    by_passage: dict[str, list[Quad]] = field(default_factory=dict)


def normalise(text: Any) -> str:
    """HippoRAG 2's normalisation: lower case, non-[a-z0-9 ] -> space, single spaces."""
    return _SPACES.sub(" ", _NON_ALNUM.sub(" ", str(text or "").lower())).strip()


def clean_time(value: Any) -> str | None:
    if value is None or isinstance(value, bool | dict | list):
        return None
    text = str(value).strip()
    return None if text.lower() in _NO_TIME else text


def clean_quad(item: Any) -> Quad | None:
    if not isinstance(item, Mapping):
        return None
    s, r, o = (normalise(item.get(k)) for k in ("subject", "relation", "object"))
    if not (s and r and o):
        return None
    tau = clean_time(item.get("time"))
    raw = [" ".join(str(item.get(k) or "").split()) for k in ("subject", "relation", "object")]
    return Quad(s, r, o, tau, fact_line(*raw, tau))


def fact_text(s: str, r: str, o: str, tau: str | None) -> str:
    """What a fact's vector is computed from (docs/methods.md "SEEM: graph memory layer")."""
    return f"{s} {r} {o}" + (f" (time: {tau})" if tau else "")


def fact_line(s: str, r: str, o: str, tau: str | None) -> str:
    """How a fact is shown to the filter and the reader."""
    return f"{s} | {r} | {o} | {tau or '-'}"


def build_request(group: Sequence[Passage], s: GraphSettings) -> LLMRequest:
    messages = seem_quadruples.build_messages(group[0].session_time, [p.prompt_tuple for p in group])
    schema = seem_quadruples.reply_schema(len(group), s.max_quadruples, s.max_chars)
    sampling = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)
    rid = request_id(STAGE_NAME, group[0].conv_id, [p.pid for p in group], seem_quadruples.VERSION,
                     messages[-1].content, schema, asdict(sampling))
    return LLMRequest(request_id=rid, stage=STAGE_NAME, conv_id=group[0].conv_id, messages=messages,
                      prompt_version=seem_quadruples.VERSION, schema=schema, sampling=sampling)


def reply_lists(result: LLMResult, n: int) -> list[list[Any]]:
    """The raw quadruple items of each passage of the request."""
    data = result.data if result.parse_ok and isinstance(result.data, dict) else {}
    if n == 1:
        items = data.get("quadruples")
        return [items if isinstance(items, list) else []]
    msgs = data.get("messages")
    msgs = msgs if isinstance(msgs, list) else []
    out = []
    for i in range(n):
        m = msgs[i] if i < len(msgs) and isinstance(msgs[i], dict) else {}
        items = m.get("quadruples")
        out.append(items if isinstance(items, list) else [])
    return out


def collect_facts(groups: Sequence[Sequence[Passage]], requests: Sequence[LLMRequest],
                  results: Sequence[LLMResult]) -> tuple[list[Fact], ExtractionCounts]:
    """Clean every reply, deduplicate on (conv, s, r, o, tau), union the provenance."""
    counts = ExtractionCounts()
    merged: dict[tuple[str, str, str, str, str | None], tuple[list[Passage], list[str]]] = {}
    shown: dict[tuple[str, str, str, str, str | None], str] = {}
    for group, req, res in zip(groups, requests, results, strict=True):
        counts.parse_failures += not res.parse_ok
        counts.truncated += res.finish_reason == "length"
        for p, items in zip(group, reply_lists(res, len(group)), strict=True):
            quads = [q for q in (clean_quad(i) for i in items) if q is not None]
            counts.malformed += len(items) - len(quads)
            counts.quadruples += len(quads)
            counts.by_passage[p.pid] = quads
            counts.passages_without_facts += not quads
            for q in quads:
                ps, rids = merged.setdefault((p.conv_id, q.s, q.r, q.o, q.tau), ([], []))
                shown.setdefault((p.conv_id, q.s, q.r, q.o, q.tau), q.shown)
                if p not in ps:
                    ps.append(p)
                if req.request_id not in rids:
                    rids.append(req.request_id)
    facts = []
    for (conv, s, r, o, tau), (ps, rids) in merged.items():
        prov = tuple(p.pid for p in sorted(ps, key=lambda p: p.position))
        shown_text = shown.get((conv, s, r, o, tau), "")
        facts.append(Fact(stable_hash(conv, s, r, o, tau), conv, s, r, o, tau, prov, tuple(rids), shown_text))
    return facts, counts
