"""Graph memory, sub-step 1: entity extraction from one window of turns (our wording).

The graph paradigm of the StructMem paper (§4 "paradigm comparison"; docs/methods.md "Paradigm
baselines") builds a knowledge graph with four cascading LLM operations per window; this is the
first. The user message is the extraction window exactly as StructMem's extractors see it
(`structmem_gpu.prompts.render_window`). One reply:

    {"entities": [{"name": "Tomas", "type": "person", "turn": 1},
                  {"name": "Biscuit", "type": "animal", "turn": 2}]}

`turn` is the window-local number of the turn where the entity first appears; it is the
entity's provenance (the event it is bound to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "graph_entities/1"

# Closed set of types (a schema enum): a small model cannot invent a type under the grammar.
ENTITY_TYPES = (
    "person",
    "animal",
    "place",
    "organization",
    "object",
    "activity",
    "event",
    "work",
    "other",
)

SYSTEM = """You build a knowledge graph from a conversation between people.

The user message gives the session date and the turns to read, numbered "[n] Speaker: text".
List the entities the numbered turns talk about:
- people (the speakers too), by their name: never "I", "you", "he" or "the speaker";
- pets and other animals, places, organisations, objects, activities and hobbies, events, \
works (books, films, songs, paintings) by their title.
Write each entity once, with the name as the conversation writes it, its type, and the number \
of the turn where it first appears. Skip dates, times, feelings and generic words (thing, day, \
stuff). Invent nothing.

Reply with JSON only: {"entities": [{"name": "...", "type": "...", "turn": n}]}"""


def schema(
    n_turns: int, *, max_items: int, max_chars: int, types: Sequence[str] = ENTITY_TYPES
) -> dict[str, Any]:
    """`{"entities": [{name, type, turn}]}`, bounded so a capped reply of a small model stays
    valid JSON; `turn` is an enum (llama.cpp's grammar ignores integer bounds)."""
    if n_turns < 1 or max_items < 1 or max_chars < 1 or not types:
        raise ValueError(
            f"bad entity schema bounds: {n_turns=}, {max_items=}, {max_chars=}, {types=}"
        )
    item = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": max_chars},
            "type": {"type": "string", "enum": list(types)},
            "turn": {"type": "integer", "enum": list(range(1, n_turns + 1))},
        },
        "required": ["name", "type", "turn"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"entities": {"type": "array", "maxItems": max_items, "items": item}},
        "required": ["entities"],
        "additionalProperties": False,
    }


def build_messages(window_text: str) -> tuple[Message, ...]:
    """`window_text` is `render_window(...)` of the window (the extractors' user message)."""
    return (Message("system", SYSTEM), Message("user", window_text))
