"""Graph memory, sub-step 2: entity de-duplication against the existing graph (our wording).

Only mentions whose name is not already a known name or alias, and that have a shortlist of
similar known entities (embedding cosine), are asked about. User message, one example:

    Known entities:
    [1] Tomas (person)
    [2] Biscuit (animal), also called: the puppy
    New mentions, each with the known entities it might be:
    (1) Tom (person); might be: 1
    (2) Biscuit's vet (person); might be: 2

One reply (`same_as` 0 = a new, different entity):

    {"decisions": [{"mention": 1, "same_as": 1}, {"mention": 2, "same_as": 0}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "graph_entity_dedup/1"

SYSTEM = """You keep a knowledge graph free of duplicate entities.

You get the known entities of a conversation, numbered [k], and new mentions, numbered (n), \
each with the known entities it might refer to. For every new mention decide whether it is \
the same real-world entity as one of its candidates (another spelling, a nickname, a shorter \
or longer form of the same name) or a different entity. Similar is not the same: a person's \
dog is not the person, a sister is not her brother.

Reply with JSON only: {"decisions": [{"mention": n, "same_as": k}]}, one decision per mention; \
same_as is the number of the known entity, or 0 when the mention is a different entity."""


@dataclass(frozen=True)
class KnownEntity:
    name: str
    entity_type: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class NewMention:
    name: str
    entity_type: str
    candidates: tuple[int, ...]  # 1-based numbers of known entities in the message


def render(known: Sequence[KnownEntity], mentions: Sequence[NewMention]) -> str:
    lines = ["Known entities:"]
    for k, e in enumerate(known, start=1):
        also = f", also called: {', '.join(e.aliases)}" if e.aliases else ""
        lines.append(f"[{k}] {e.name} ({e.entity_type}){also}")
    lines += ["", "New mentions, each with the known entities it might be:"]
    for n, m in enumerate(mentions, start=1):
        lines.append(
            f"({n}) {m.name} ({m.entity_type}); might be: {', '.join(map(str, m.candidates))}"
        )
    return "\n".join(lines)


def build_messages(
    known: Sequence[KnownEntity], mentions: Sequence[NewMention]
) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render(known, mentions)))


def schema(n_mentions: int, n_known: int) -> dict[str, Any]:
    """One decision per mention at most; both numbers are enums (grammar-exact)."""
    if n_mentions < 1 or n_known < 1:
        raise ValueError(f"bad dedup schema bounds: {n_mentions=}, {n_known=}")
    item = {
        "type": "object",
        "properties": {
            "mention": {"type": "integer", "enum": list(range(1, n_mentions + 1))},
            "same_as": {"type": "integer", "enum": list(range(n_known + 1))},
        },
        "required": ["mention", "same_as"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"decisions": {"type": "array", "maxItems": n_mentions, "items": item}},
        "required": ["decisions"],
        "additionalProperties": False,
    }
