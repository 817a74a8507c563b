"""Graph memory, sub-step 4: relation de-duplication and conflict resolution (our wording).

New relations that share an entity with existing relations are compared with the most similar
of those. The model says, per new relation, whether it is new information, a duplicate of an
existing relation (which then gains the new provenance), or an update that makes an existing
relation obsolete (that relation is MARKED obsolete, never deleted). User message, one example:

    Existing relations:
    [1] (2024-03-17) Tomas -> lives in -> Lisbon
    New relations, each with the existing relations to compare with:
    (1) (2024-05-02) Tomas -> moved to -> Porto; compare with: 1

One reply (`existing` 0 when the action is "add"):

    {"decisions": [{"relation": 1, "action": "update", "existing": 1}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "graph_relation_dedup/1"
ACTIONS = ("add", "duplicate", "update")

SYSTEM = """You keep a knowledge graph free of duplicate and outdated relations.

You get existing relations of a conversation, numbered [k], and new relations, numbered (n), \
each with the existing relations to compare it with; every relation has the date it was said. \
For every new relation choose one action:
- "duplicate": it says the same as existing relation k (other words, same meaning);
- "update": it changes or contradicts existing relation k, which is now outdated (someone \
moved, changed jobs, ended or started something, changed their mind);
- "add": it is new information; existing is then 0.
Keep both when they can both be true: having two pets, visiting two cities.

Reply with JSON only: {"decisions": [{"relation": n, "action": "add" | "duplicate" | "update", \
"existing": k}]}, one decision per new relation."""


@dataclass(frozen=True)
class RelationLine:
    date: str  # ISO date of the relation's (first) event, or "?"
    source: str
    relation: str
    target: str

    def render(self) -> str:
        return f"({self.date}) {self.source} -> {self.relation} -> {self.target}"


def render(
    existing: Sequence[RelationLine], new: Sequence[tuple[RelationLine, tuple[int, ...]]]
) -> str:
    lines = ["Existing relations:"]
    lines += [f"[{k}] {r.render()}" for k, r in enumerate(existing, start=1)]
    lines += ["", "New relations, each with the existing relations to compare with:"]
    for n, (r, cands) in enumerate(new, start=1):
        lines.append(f"({n}) {r.render()}; compare with: {', '.join(map(str, cands))}")
    return "\n".join(lines)


def build_messages(
    existing: Sequence[RelationLine], new: Sequence[tuple[RelationLine, tuple[int, ...]]]
) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render(existing, new)))


def schema(n_new: int, n_existing: int) -> dict[str, Any]:
    if n_new < 1 or n_existing < 1:
        raise ValueError(f"bad relation-dedup schema bounds: {n_new=}, {n_existing=}")
    item = {
        "type": "object",
        "properties": {
            "relation": {"type": "integer", "enum": list(range(1, n_new + 1))},
            "action": {"type": "string", "enum": list(ACTIONS)},
            "existing": {"type": "integer", "enum": list(range(n_existing + 1))},
        },
        "required": ["relation", "action", "existing"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"decisions": {"type": "array", "maxItems": n_new, "items": item}},
        "required": ["decisions"],
        "additionalProperties": False,
    }
