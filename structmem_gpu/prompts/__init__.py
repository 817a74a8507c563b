"""Official texts (official.py, pinned.py, sources.py) and what every prompt module shares.

Prompt modules live beside their method (methods/<m>/prompts/, eval/prompts/), one per prompt,
each with a VERSION (part of cache keys and provenance). Extraction (StructMem's two
perspectives, the graph baseline) shares one user message and one reply schema, defined here
so that the factual and relational prompts cannot drift apart:

    >>> print(render_window(datetime(2023, 5, 8, 13, 56), [], [("Caroline", "I went hiking.")]))
    Session date: 2023-05-08 13:56 (Monday)
    <BLANKLINE>
    Turns:
    [1] Caroline: I went hiking.

    extraction_schema(8, max_items=32, max_item_chars=400)
    # {"type": "object", "properties": {"entries": {"type": "array", "maxItems": 32, "items":
    #   {"type": "object", "properties": {"turn": {"type": "integer", "minimum": 1, "maximum": 8,
    #    "enum": [1, 2, 3, 4, 5, 6, 7, 8]},
    #    "text": {"type": "string", "minLength": 1, "maxLength": 400}}, ...}}}, ...}

Changing `render_window` changes what both extraction prompts see: bump both VERSIONs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any


def extraction_schema(
    n_turns: int, *, max_items: int | None, max_item_chars: int
) -> dict[str, Any]:
    """Reply schema: `{"entries": [{"turn": 1..n_turns, "text": str}]}`, optionally bounded
    (max_items None = no maxItems) so that a small model's reply stays short."""
    if n_turns < 1 or (max_items is not None and max_items < 1) or max_item_chars < 1:
        raise ValueError(
            f"bad extraction schema bounds: {n_turns=}, {max_items=}, {max_item_chars=}"
        )
    item = {
        "type": "object",
        "properties": {
            # enum as well as the bounds: llama.cpp's grammar ignores integer minimum/maximum
            # (seen: SmolLM2 answered turn 2 of a 1-turn window) but compiles enum exactly.
            "turn": {
                "type": "integer",
                "minimum": 1,
                "maximum": n_turns,
                "enum": list(range(1, n_turns + 1)),
            },
            "text": {"type": "string", "minLength": 1, "maxLength": max_item_chars},
        },
        "required": ["turn", "text"],
        "additionalProperties": False,
    }
    return list_reply_schema("entries", item, max_items)


def list_reply_schema(key: str, item: dict[str, Any], max_items: int | None) -> dict[str, Any]:
    """`{key: [item, ...]}`, the one shape of every extraction reply (ours and the reference
    format's `{"data": [...]}`), bounded by `max_items` when given."""
    items: dict[str, Any] = {"type": "array", "items": item}
    if max_items is not None:
        items["maxItems"] = max_items
    return {
        "type": "object",
        "properties": {key: items},
        "required": [key],
        "additionalProperties": False,
    }


def render_window(
    session_time: datetime, context: Sequence[tuple[str, str]], turns: Sequence[tuple[str, str]]
) -> str:
    """The extraction user message: session date, read-only context lines, numbered turns.

    `context` and `turns` are (speaker, display text) pairs; the display text already carries
    an image caption as ` [image: <caption>]` (structmem_gpu.data.display_text).
    """
    lines = [f"Session date: {session_time:%Y-%m-%d %H:%M} ({session_time:%A})", ""]
    if context:
        lines.append("Earlier in this session (context only):")
        lines.extend(f"(context) {speaker}: {text}" for speaker, text in context)
        lines.append("")
    lines.append("Turns:")
    lines.extend(f"[{i}] {speaker}: {text}" for i, (speaker, text) in enumerate(turns, start=1))
    return "\n".join(lines)
