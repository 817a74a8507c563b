"""SEEM recognition filter, our wording of HippoRAG 2's filter (docs/methods.md
"SEEM: retrieval" step 4).

Shows the question and the top facts numbered 1..k; the reply picks the relevant ones by
number (at most `seem.retrieve.filter_max`, possibly none). Picking numbers instead of
re-writing fact strings makes "map back to the closest candidate" exact. One reply:

    {"relevant": [2, 1]}
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "seem_filter/1"

SYSTEM = """You select the facts that help answer a question about a conversation.
The facts are numbered; each is "subject | relation | object | time". Choose the facts that \
are about what the question asks, most useful first. Choose none if no fact is relevant.
Reply with JSON only: {"relevant": [numbers of the chosen facts]}"""


def reply_schema(n_facts: int, max_items: int) -> dict[str, Any]:
    return {
        "type": "object",
        # An enum, not integer minimum/maximum: llama-cpp-python's grammar ignores integer bounds.
        "properties": {"relevant": {"type": "array", "items": {"enum": list(range(1, n_facts + 1))},
                                    "maxItems": max_items}},
        "required": ["relevant"],
        "additionalProperties": False,
    }


def build_messages(question: str, facts: Sequence[str], now: datetime | None = None) -> tuple[Message, ...]:
    lines = [f"Current date: {now:%Y-%m-%d}"] if now is not None else []
    lines.append(f"Question: {question}")
    lines.append("Facts:")
    lines.extend(f"{i}. {f}" for i, f in enumerate(facts, start=1))
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
