"""Graph memory state: entities and relations of one conversation, and their bookkeeping.

Pure Python + NumPy (no LLM, no encoder), so the rules are unit-tested directly:

- a mention whose normalised name is a known name or alias joins that entity (no LLM);
- a merged entity keeps ALL provenance: aliases, event ids and request ids of every mention;
- an exact duplicate relation (same source, target and normalised relation) of an active one
  only adds provenance; a relation judged a duplicate does the same;
- a relation judged obsolete is MARKED (`status="obsolete"`, `superseded_by`, the deciding
  request), never deleted.

One entity and one relation, as graph_entities / graph_relations rows (schemas in
graph_memory.py):

    {"entity_id": "ent:1c9e…", "conv_id": "sample-1", "name": "Tomas", "entity_type": "person",
     "aliases": ["Tom"], "event_ids": ["sample-1:D1:2", "sample-1:D2:1"],
     "request_ids": ["graph:5e…", "graph:77…"], "mentions": 3, "first_step": 0}
    {"relation_id": "rel:9a…", "source_id": "ent:1c9e…", "target_id": "ent:4f0d…",
     "relation": "adopted", "text": "Tomas -> adopted -> Biscuit", "status": "active",
     "superseded_by": null, "event_ids": ["sample-1:D2:1"], …}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from pydantic import Field

import numpy as np

from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.config.settings import COUNT, RATE, SIZE, Settings, TEMPERATURE, TOKENS

ACTIVE, OBSOLETE = "active", "obsolete"
SUB_STEPS = ("entities", "entity_dedup", "relations", "relation_dedup")  # per wavefront step
_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = " \t\n\"'`.,;:!?()[]{}"


class SubStepTokens(Settings):
    """graph_memory.max_tokens: the output budget of each sub-step's requests."""

    entities: TOKENS = Field(384, description="Entity extraction (one request per window).")
    entity_dedup: TOKENS = Field(192, description="Entity de-duplication.")
    relations: TOKENS = Field(512, description="Relation extraction.")
    relation_dedup: TOKENS = Field(256, description=(
        "Relation de-duplication / conflict resolution."))

    def __getitem__(self, sub_step: str) -> int:
        return int(getattr(self, sub_step))


class GraphSettings(Settings):
    """conf/method/graph_memory.yaml `graph_memory.*` (the build knobs; question_* are the
    retrieve stage's, graph_retrieve.QuestionEntities). The block is generated from both."""

    node: ClassVar[str] = "graph_memory"
    yaml_home: ClassVar[str | None] = "method/graph_memory.yaml"

    turns_per_request: SIZE = Field(8, description=(
        "Turns per window = one wavefront step per window (mem0 adds one message at a time)."))
    entity_types: tuple[str, ...] = Field((
        "person", "animal", "place", "organization", "object", "activity", "event", "work", "other"), description=(
        "Entity types (a schema enum: a small model cannot invent one under the grammar)."))
    max_entities: SIZE = Field(12, description="Schema maxItems of entities per window.")
    max_name_chars: SIZE = Field(60, description="Schema maxLength of an entity name.")
    max_relations: SIZE = Field(12, description="Schema maxItems of relations per window.")
    max_relation_chars: SIZE = Field(60, description="Schema maxLength of a relation phrase.")
    entity_threshold: RATE = Field(0.7, description=(
        "A new name goes to the LLM dedup when a known name/alias has cosine >= this (mem0 uses "
        "0.7 to collect neighbours); lower = more dedup requests, fewer missed merges."))
    entity_candidates_k: COUNT = Field(5, description="Known entities shown per new mention.")
    relation_candidates_k: COUNT = Field(8, description=(
        "Existing relations (sharing an entity) compared per new relation."))
    max_tokens: SubStepTokens = Field(SubStepTokens(), description=(
        "Output budget per request of each sub-step."))
    temperature: TEMPERATURE = Field(0.0, description="Sampling temperature (0 = greedy decoding).")


def normalize(name: str) -> str:
    """Case- and spacing-insensitive key of a name ("  Biscuit! " -> "biscuit")."""
    return _SPACE.sub(" ", name.casefold()).strip(_EDGE_PUNCT)


def _add_unique(target: list[str], values: list[str] | tuple[str, ...]) -> None:
    for v in values:
        if v not in target:
            target.append(v)


@dataclass(frozen=True)
class Mention:
    """One entity as a window's extraction (or the window's speaker list) produced it."""

    conv_id: str
    name: str
    entity_type: str
    event_ids: tuple[str, ...]  # the turn(s) of the window where it appears
    request_id: str | None  # extraction request; None for a speaker added without the LLM

    @property
    def norm(self) -> str:
        return normalize(self.name)


@dataclass(frozen=True)
class NewRelation:
    """One relation a window's relation request produced, endpoints already canonical."""

    conv_id: str
    source_id: str
    target_id: str
    relation: str
    event_id: str
    time: datetime | None
    request_id: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.source_id, normalize(self.relation), self.target_id)


@dataclass
class Entity:
    entity_id: str
    conv_id: str
    name: str
    entity_type: str
    first_step: int
    aliases: list[str] = field(default_factory=list)
    event_ids: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    mentions: int = 0

    def absorb(self, m: Mention, decided_by: str | None = None) -> None:
        """Merge a mention: nothing it carried is lost."""
        if normalize(m.name) != normalize(self.name) and m.name not in self.aliases:
            self.aliases.append(m.name)
        _add_unique(self.event_ids, m.event_ids)
        _add_unique(self.request_ids, [r for r in (m.request_id, decided_by) if r])
        self.mentions += 1


@dataclass
class Relation:
    relation_id: str
    conv_id: str
    source_id: str
    target_id: str
    relation: str
    step: int
    first_time: datetime | None
    last_time: datetime | None
    event_ids: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    status: str = ACTIVE
    superseded_by: str | None = None
    obsoleted_by_request: str | None = None
    mentions: int = 1

    def absorb(self, new: NewRelation, decided_by: str | None = None) -> None:
        _add_unique(self.event_ids, [new.event_id])
        _add_unique(self.request_ids, [r for r in (new.request_id, decided_by) if r])
        if new.time is not None:
            self.first_time = (
                new.time if self.first_time is None else min(self.first_time, new.time)
            )
            self.last_time = new.time if self.last_time is None else max(self.last_time, new.time)
        self.mentions += 1


def _cosines(vec: np.ndarray, mat: np.ndarray) -> np.ndarray:
    return mat @ vec if mat.size else np.zeros(0, dtype=np.float32)


@dataclass
class ConvGraph:
    """The graph of one conversation while the wavefront builds it."""

    conv_id: str
    entities: dict[str, Entity] = field(default_factory=dict)
    by_norm: dict[str, str] = field(default_factory=dict)  # normalised name or alias -> entity_id
    name_owner: list[str] = field(default_factory=list)  # entity_id of each row of name_vecs
    name_vecs: list[np.ndarray] = field(default_factory=list)
    relations: dict[str, Relation] = field(default_factory=dict)
    rel_vecs: dict[str, np.ndarray] = field(default_factory=dict)

    # ---- entities ----------------------------------------------------------------------
    def known(self, m: Mention) -> str | None:
        return self.by_norm.get(m.norm)

    def add_entity(self, m: Mention, step: int, vec: np.ndarray | None) -> Entity:
        eid = f"ent:{stable_hash(self.conv_id, m.norm)}"
        ent = Entity(eid, self.conv_id, m.name, m.entity_type, step)
        ent.absorb(m)
        self.entities[eid] = ent
        self._index_name(eid, m, vec)
        return ent

    def merge_entity(
        self, entity_id: str, m: Mention, vec: np.ndarray | None, decided_by: str | None = None
    ) -> Entity:
        ent = self.entities[entity_id]
        ent.absorb(m, decided_by)
        self._index_name(entity_id, m, vec)
        return ent

    def _index_name(self, entity_id: str, m: Mention, vec: np.ndarray | None) -> None:
        if m.norm in self.by_norm:
            return
        self.by_norm[m.norm] = entity_id
        if vec is not None:
            self.name_owner.append(entity_id)
            self.name_vecs.append(vec)

    def entity_shortlist(
        self, vec: np.ndarray, threshold: float, k: int
    ) -> list[tuple[str, float]]:
        """Known entities whose name or an alias has cosine >= threshold, best k (best alias)."""
        if not self.name_vecs or k <= 0:
            return []
        sims = _cosines(vec, np.stack(self.name_vecs))
        best: dict[str, float] = {}
        for owner, s in zip(self.name_owner, sims.tolist(), strict=True):
            if s >= threshold and s > best.get(owner, -2.0):
                best[owner] = s
        return sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]

    # ---- relations ---------------------------------------------------------------------
    def active_duplicate(self, new: NewRelation) -> str | None:
        for rid, r in self.relations.items():
            if r.status == ACTIVE and (r.source_id, normalize(r.relation), r.target_id) == new.key:
                return rid
        return None

    def relation_candidates(self, new: NewRelation, vec: np.ndarray, k: int) -> list[str]:
        """Active relations sharing an endpoint with `new`, most similar first, at most k."""
        ends = {new.source_id, new.target_id}
        pool = [
            rid
            for rid, r in self.relations.items()
            if r.status == ACTIVE and ({r.source_id, r.target_id} & ends) and rid in self.rel_vecs
        ]
        if not pool or k <= 0:
            return []
        sims = _cosines(vec, np.stack([self.rel_vecs[r] for r in pool]))
        order = sorted(range(len(pool)), key=lambda i: (-float(sims[i]), pool[i]))
        return [pool[i] for i in order[:k]]

    def add_relation(self, new: NewRelation, step: int, vec: np.ndarray | None) -> Relation:
        rid = f"rel:{stable_hash(self.conv_id, *new.key, new.event_id, step)}"
        rel = Relation(
            rid,
            self.conv_id,
            new.source_id,
            new.target_id,
            new.relation,
            step,
            new.time,
            new.time,
            [new.event_id],
            [new.request_id],
        )
        self.relations[rid] = rel
        if vec is not None:
            self.rel_vecs[rid] = vec
        return rel

    def merge_relation(
        self, relation_id: str, new: NewRelation, decided_by: str | None = None
    ) -> Relation:
        rel = self.relations[relation_id]
        rel.absorb(new, decided_by)
        return rel

    def mark_obsolete(self, relation_id: str, superseded_by: str, decided_by: str) -> Relation:
        rel = self.relations[relation_id]
        rel.status, rel.superseded_by, rel.obsoleted_by_request = (
            OBSOLETE,
            superseded_by,
            decided_by,
        )
        _add_unique(rel.request_ids, [decided_by])
        return rel

    def relation_text(self, rel: Relation | NewRelation) -> str:
        return f"{self.entities[rel.source_id].name} -> {rel.relation} -> {self.entities[rel.target_id].name}"

    # ---- rows --------------------------------------------------------------------------
    def entity_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "entity_id": e.entity_id,
                "conv_id": e.conv_id,
                "name": e.name,
                "entity_type": e.entity_type,
                "aliases": e.aliases,
                "event_ids": e.event_ids,
                "request_ids": e.request_ids,
                "mentions": e.mentions,
                "first_step": e.first_step,
            }
            for e in self.entities.values()
        ]

    def relation_rows(self) -> list[dict[str, Any]]:
        ents = self.entities
        return [
            {
                "relation_id": r.relation_id,
                "conv_id": r.conv_id,
                "source_id": r.source_id,
                "target_id": r.target_id,
                "source_name": ents[r.source_id].name,
                "target_name": ents[r.target_id].name,
                "relation": r.relation,
                "text": self.relation_text(r),
                "event_ids": r.event_ids,
                "first_time": r.first_time,
                "last_time": r.last_time,
                "request_ids": r.request_ids,
                "status": r.status,
                "superseded_by": r.superseded_by,
                "obsoleted_by_request": r.obsoleted_by_request,
                "mentions": r.mentions,
                "step": r.step,
            }
            for r in self.relations.values()
        ]
