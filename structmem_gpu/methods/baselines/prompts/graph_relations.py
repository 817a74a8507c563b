"""Graph memory, sub-step 3: relation extraction between the window's entities (our wording).

The user message is the extraction window (`render_window`) followed by the window's entities
after de-duplication, numbered; the reply refers to entities by number only (an enum), so
every relation is bound to a known node. One reply:

    {"relations": [{"source": 1, "relation": "adopted", "target": 2, "turn": 2}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "graph_relations/1"

SYSTEM = """You build a knowledge graph from a conversation between people.

The user message gives the session date, the turns numbered "[n] Speaker: text", and the \
entities of these turns, numbered [k]. Write down the relations between two listed entities \
that the turns state:
- source and target are entity numbers and differ;
- relation is a short verb phrase read from source to target: "adopted", "works at", \
"is the sister of", "plans to visit", "gave a book to";
- when the turn dates the relation, put the date in the relation, computed from the session \
date ("adopted on 2024-03-16");
- turn is the number of the turn that states the relation.
Write only what the turns say. Invent nothing.

Reply with JSON only: {"relations": [{"source": k, "relation": "...", "target": k, "turn": n}]}"""


def render(window_text: str, entities: Sequence[tuple[str, str]]) -> str:
    """The extraction window, then `[k] name (type)` for the window's entities."""
    lines = [window_text, "", "Entities:"]
    lines += [f"[{k}] {name} ({etype})" for k, (name, etype) in enumerate(entities, start=1)]
    return "\n".join(lines)


def build_messages(window_text: str, entities: Sequence[tuple[str, str]]) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render(window_text, entities)))


def schema(n_entities: int, n_turns: int, *, max_items: int, max_chars: int) -> dict[str, Any]:
    if n_entities < 2 or n_turns < 1 or max_items < 1 or max_chars < 1:
        raise ValueError(
            f"bad relation schema bounds: {n_entities=}, {n_turns=}, {max_items=}, {max_chars=}"
        )
    ids = {"type": "integer", "enum": list(range(1, n_entities + 1))}
    item = {
        "type": "object",
        "properties": {
            "source": ids,
            "relation": {"type": "string", "minLength": 1, "maxLength": max_chars},
            "target": ids,
            "turn": {"type": "integer", "enum": list(range(1, n_turns + 1))},
        },
        "required": ["source", "relation", "target", "turn"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"relations": {"type": "array", "maxItems": max_items, "items": item}},
        "required": ["relations"],
        "additionalProperties": False,
    }
