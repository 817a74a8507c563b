"""SEEM graph memory layer: quadruple extraction from a passage
(docs/methods.md "SEEM: graph memory layer"; our wording).

Same user message as F_ext (seem_frame.render_passages: session time, `[speaker]: text`,
image line). Several numbered messages per request (`seem.passages_per_request` > 1, the CI
deviation) give exactly one list per message, in order. One single-passage reply:

    {"quadruples": [{"subject": "Lena", "relation": "signed up for",
                     "object": "Riverside Half Marathon", "time": "2024-05-18"}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.frame import render_passages

VERSION = "seem_quadruples/1"

RULES = """Each fact is a quadruple:
- subject and object: short entity names (people, pets, places, organisations, objects, \
activities, titles); at least one of them should be a named entity. Resolve "I", "you", "he", \
"she" to the person's name (the speaker is named before the message);
- relation: a short verb phrase ("adopted", "works at", "plans to visit");
- time: when the fact holds, as an ISO date (2023-05-07), month (2023-05) or year computed from \
the session time ("last week" in a session of 8 May 2023 is 2023-05-01), or null when timeless. \
Give a time whenever the message allows it.
Write only what the message says; greetings give no facts."""

SYSTEM = f"""You extract the facts of a conversation message as quadruples.
{RULES}
Reply with JSON only: {{"quadruples": [{{"subject": "...", "relation": "...", "object": "...", \
"time": "..." or null}}]}}"""

SYSTEM_MANY = f"""You extract the facts of each numbered conversation message as quadruples.
{RULES}
Reply with JSON only: {{"messages": [{{"quadruples": [...]}} for each message, in order]}}, \
each quadruple {{"subject": "...", "relation": "...", "object": "...", "time": "..." or null}}"""


def quadruple_schema(max_chars: int) -> dict[str, Any]:
    s = {"type": "string", "minLength": 1, "maxLength": max_chars}
    return {
        "type": "object",
        "properties": {"subject": s, "relation": s, "object": s,
                       "time": {"anyOf": [{"type": "string", "maxLength": max_chars}, {"type": "null"}]}},
        "required": ["subject", "relation", "object", "time"],
        "additionalProperties": False,
    }


def _list(max_items: int, max_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"quadruples": {"type": "array", "items": quadruple_schema(max_chars), "maxItems": max_items}},
        "required": ["quadruples"],
        "additionalProperties": False,
    }


def reply_schema(n_passages: int, max_items: int, max_chars: int) -> dict[str, Any]:
    if n_passages == 1:
        return _list(max_items, max_chars)
    return {
        "type": "object",
        "properties": {"messages": {"type": "array", "items": _list(max_items, max_chars),
                                    "minItems": n_passages, "maxItems": n_passages}},
        "required": ["messages"],
        "additionalProperties": False,
    }


def build_messages(session_time: datetime | None, passages: Sequence[tuple[str, str, str | None]]
                   ) -> tuple[Message, ...]:
    system = SYSTEM if len(passages) == 1 else SYSTEM_MANY
    return (Message("system", system), Message("user", render_passages(session_time, passages)))
