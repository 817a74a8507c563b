"""Graph memory sub-steps 2 and 4: LLM de-duplication of entities and relations.

    python jobs/run.py method=graph_memory stages=[graph]     # the stage in graph_memory.py

Only what cheap rules cannot settle goes to the LLM. An entity mention with a known
normalised name joins that entity without a request; a mention with a shortlist (known names
or aliases at cosine >= `graph_memory.entity_threshold`, best `entity_candidates_k`) is asked
about; one without becomes a new entity. A relation equal to an active one (same endpoints,
same normalised phrase) only adds provenance; one sharing an endpoint with active relations is
compared with the `relation_candidates_k` most similar of them; others are added. One request
per window and sub-step, all windows of a wavefront step in one batch. A decision that names a
number outside the item's own candidates is invalid: the item is then kept as new (counted),
never merged by accident. Decided, e.g.:

    EntityDecision(mention=Mention(name="Tom", ...), same_as="ent:1c9e…", request_id="graph:…")
    RelationDecision(new=NewRelation(...), action="update", existing="rel:9a…", request_id="graph:…")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.baselines.graph_extract import STAGE_NAME
from structmem_gpu.methods.baselines.graph_state import (
    ConvGraph,
    GraphSettings,
    Mention,
    NewRelation,
    Relation,
)
from structmem_gpu.methods.baselines.prompts import graph_entity_dedup as PE
from structmem_gpu.methods.baselines.prompts import graph_relation_dedup as PR


@dataclass
class DecisionCounts:
    parse_failures: int = 0
    invalid: int = 0  # a number outside the item's candidates, or an action without its relation
    undecided: int = 0  # items the reply gave no decision for (kept as new)


@dataclass(frozen=True)
class PendingMention:
    mention: Mention
    vec: np.ndarray
    candidates: tuple[str, ...]  # entity ids, best first


@dataclass(frozen=True)
class PendingRelation:
    new: NewRelation
    vec: np.ndarray
    candidates: tuple[str, ...]  # relation ids, best first


@dataclass(frozen=True)
class EntityDecision:
    mention: Mention
    vec: np.ndarray
    same_as: str | None  # entity id, or None = a new entity
    request_id: str


@dataclass(frozen=True)
class RelationDecision:
    new: NewRelation
    vec: np.ndarray
    action: str  # "add" | "duplicate" | "update"
    existing: str | None  # relation id for duplicate / update
    request_id: str


@dataclass(frozen=True)
class DedupPlan:
    """One window's dedup request: `known[k-1]` is the id shown as number k."""

    conv_id: str
    known: tuple[str, ...]
    pending: tuple[PendingMention, ...] | tuple[PendingRelation, ...]
    request: LLMRequest
    numbers: tuple[tuple[int, ...], ...] = field(default=())  # candidates of each item, as numbers


def _numbering(
    candidate_lists: Sequence[Sequence[str]],
) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    known = tuple(dict.fromkeys(c for cands in candidate_lists for c in cands))
    pos = {c: k for k, c in enumerate(known, start=1)}
    return known, tuple(tuple(pos[c] for c in cands) for cands in candidate_lists)


def _request(
    conv_id: str,
    step: int,
    version: str,
    messages: tuple,
    schema: dict,
    max_tokens: int,
    temperature: float,
) -> LLMRequest:
    rid = request_id(STAGE_NAME, conv_id, step, version, messages[-1].content, schema)
    return LLMRequest(
        request_id=rid,
        stage=STAGE_NAME,
        conv_id=conv_id,
        messages=messages,
        prompt_version=version,
        schema=schema,
        sampling=Sampling(temperature=temperature, max_tokens=max_tokens),
    )


def entity_dedup_plan(
    graph: ConvGraph, step: int, pending: Sequence[PendingMention], s: GraphSettings
) -> DedupPlan:
    known, numbers = _numbering([p.candidates for p in pending])
    shown = [
        PE.KnownEntity(
            graph.entities[e].name, graph.entities[e].entity_type, tuple(graph.entities[e].aliases)
        )
        for e in known
    ]
    mentions = [
        PE.NewMention(p.mention.name, p.mention.entity_type, nums)
        for p, nums in zip(pending, numbers)
    ]
    req = _request(
        graph.conv_id,
        step,
        PE.VERSION,
        PE.build_messages(shown, mentions),
        PE.schema(len(pending), len(known)),
        s.max_tokens["entity_dedup"],
        s.temperature,
    )
    return DedupPlan(graph.conv_id, known, tuple(pending), req, numbers)


def _decisions(res: LLMResult, item_key: str, counts: DecisionCounts) -> dict[int, dict]:
    """item number -> its first decision in the reply."""
    counts.parse_failures += not res.parse_ok
    if not res.parse_ok or not isinstance(res.data, dict):
        return {}
    out: dict[int, dict] = {}
    for d in res.data.get("decisions") or []:
        n = d.get(item_key)
        if isinstance(n, int) and not isinstance(n, bool) and n not in out:
            out[n] = d
    return out


def entity_decisions(
    plan: DedupPlan, res: LLMResult, counts: DecisionCounts
) -> list[EntityDecision]:
    by_item = _decisions(res, "mention", counts)
    out = []
    for n, (p, nums) in enumerate(zip(plan.pending, plan.numbers), start=1):
        assert isinstance(p, PendingMention)
        d = by_item.get(n)
        same = d.get("same_as") if d else None
        if d is None:
            counts.undecided += 1
        elif same not in (0, *nums):
            counts.invalid += 1
            same = 0
        target = plan.known[same - 1] if isinstance(same, int) and same > 0 else None
        out.append(EntityDecision(p.mention, p.vec, target, plan.request.request_id))
    return out


def _relation_line(graph: ConvGraph, rel: Relation | NewRelation) -> PR.RelationLine:
    t = rel.first_time if isinstance(rel, Relation) else rel.time
    return PR.RelationLine(
        "?" if t is None else f"{t:%Y-%m-%d}",
        graph.entities[rel.source_id].name,
        rel.relation,
        graph.entities[rel.target_id].name,
    )


def relation_dedup_plan(
    graph: ConvGraph, step: int, pending: Sequence[PendingRelation], s: GraphSettings
) -> DedupPlan:
    known, numbers = _numbering([p.candidates for p in pending])
    existing = [_relation_line(graph, graph.relations[r]) for r in known]
    new = [(_relation_line(graph, p.new), nums) for p, nums in zip(pending, numbers)]
    req = _request(
        graph.conv_id,
        step,
        PR.VERSION,
        PR.build_messages(existing, new),
        PR.schema(len(pending), len(known)),
        s.max_tokens["relation_dedup"],
        s.temperature,
    )
    return DedupPlan(graph.conv_id, known, tuple(pending), req, numbers)


def relation_decisions(
    plan: DedupPlan, res: LLMResult, counts: DecisionCounts
) -> list[RelationDecision]:
    by_item = _decisions(res, "relation", counts)
    out = []
    for n, (p, nums) in enumerate(zip(plan.pending, plan.numbers), start=1):
        assert isinstance(p, PendingRelation)
        d = by_item.get(n)
        action, k = ("add", 0) if d is None else (str(d.get("action")), d.get("existing"))
        if d is None:
            counts.undecided += 1
        elif action not in PR.ACTIONS or (action != "add" and k not in nums):
            counts.invalid += 1
            action = "add"
        existing = plan.known[k - 1] if action != "add" and isinstance(k, int) else None
        out.append(RelationDecision(p.new, p.vec, action, existing, plan.request.request_id))
    return out
