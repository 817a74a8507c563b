"""SEEM retrieval step D1: quadruples of a question (our wording; docs/methods.md
"SEEM: retrieval").

Unknown slots are written "?"; the stage renders every quadruple like a fact text and scores
facts by the best cosine over them and the raw question. One reply:

    {"quadruples": [{"subject": "Tomas", "relation": "adopted", "object": "?", "time": null}]}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.quadruples import quadruple_schema

VERSION = "seem_query/1"

SYSTEM = """You turn a question about a conversation into the facts it asks about, as \
quadruples (subject, relation, object, time). Write "?" for the part the question asks for \
and for anything it leaves open; time is an ISO date or period, or null.
Example: "When did Lena run her first half marathon?" -> {"quadruples": [{"subject": "Lena", \
"relation": "ran", "object": "first half marathon", "time": "?"}]}
Reply with JSON only: {"quadruples": [...]}"""


def reply_schema(max_items: int, max_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"quadruples": {"type": "array", "items": quadruple_schema(max_chars),
                                      "minItems": 1, "maxItems": max_items}},
        "required": ["quadruples"],
        "additionalProperties": False,
    }


def build_messages(question: str, now: datetime | None = None) -> tuple[Message, ...]:
    lines = [f"Current date: {now:%Y-%m-%d}"] if now is not None else []
    lines.append(f"Question: {question}")
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
