"""SEEM F_ext: one Episodic Event Frame per passage
(docs/methods.md "SEEM: frames"; our own wording).

The user message gives the session time and the passage(s); the reply is constrained by
`reply_schema`. With `seem.passages_per_request > 1` (a CI-only deviation: the spec sends one
passage per request) the passages are numbered and the reply holds exactly one frame per
passage, in order. One single-passage reply:

    {"summary": "Lena signed up for the Riverside Half Marathon on 18 May 2024.",
     "events": [{"participants": ["Lena"], "action": ["Lena signed up for the half marathon"],
                 "time": "2024-05-18", "location": null, "reason": null, "method": null}]}

`event_schema` is shared by every SEEM prompt that writes events (fusion, windowed fusion):
bump their VERSIONs too when it changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "seem_frame/1"

SYSTEM = """You turn one conversation message into an episodic event frame.

Reply with JSON only: {"summary": "...", "events": [{"participants": [...], "action": [...], \
"time": ..., "location": ..., "reason": ..., "method": ...}]}

- summary: 1 to 3 sentences in the active voice that say what happened. Use names, never \
"I", "you", "he" or "she" (the speaker is named before the message).
- events: the things that happen, happened or are planned in the message. Each event has:
  - participants: the names of the people involved;
  - action: short subject-verb-object phrases ("Lena bought running shoes"), nothing else;
  - time: when it happens, as an ISO date (2023-05-07) or month (2023-05) computed from the \
session time. "Yesterday" in a session of 8 May 2023 is 2023-05-07; "three years ago" is 2020. \
For a period give its start. null when the message gives no time;
  - location: where, or null;
  - reason: why, the purpose or cause, or null;
  - method: how, the means, manner or frequency ("every Sunday"), or null.
- Keep the roles apart: time, place, purpose and means never go into action.
- A line "[Image: ...]" describes a photo the speaker shared: treat it as part of the message.
- Write null rather than guess. Greetings and small talk give a summary and no events."""

SYSTEM_MANY = SYSTEM.replace(
    "You turn one conversation message into an episodic event frame.",
    "You turn each numbered conversation message into its own episodic event frame.",
).replace(
    'Reply with JSON only: {"summary"',
    'Reply with JSON only: {"frames": [<one frame per message, in order>]}, each frame {"summary"',
)


@dataclass(frozen=True)
class FrameBounds:
    """JSON-schema bounds: a reply capped by max_tokens on a small model stays valid JSON."""

    max_events: int
    max_participants: int
    max_actions: int  # schema bound; the stage splits events above seem.frames.max_actions
    max_chars: int  # every slot string
    summary_chars: int


def _string(n: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": n}


def _nullable(n: int) -> dict[str, Any]:
    return {"anyOf": [_string(n), {"type": "null"}]}


def event_schema(b: FrameBounds) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "participants": {"type": "array", "items": _string(b.max_chars), "maxItems": b.max_participants},
            "action": {"type": "array", "items": _string(b.max_chars), "maxItems": b.max_actions},
            "time": _nullable(b.max_chars),
            "location": _nullable(b.max_chars),
            "reason": _nullable(b.max_chars),
            "method": _nullable(b.max_chars),
        },
        "required": ["participants", "action", "time", "location", "reason", "method"],
        "additionalProperties": False,
    }


def frame_schema(b: FrameBounds) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "minLength": 1, "maxLength": b.summary_chars},
            "events": {"type": "array", "items": event_schema(b), "maxItems": b.max_events},
        },
        "required": ["summary", "events"],
        "additionalProperties": False,
    }


def reply_schema(n_passages: int, b: FrameBounds) -> dict[str, Any]:
    """One frame object for one passage; {"frames": [exactly n frames]} for several."""
    if n_passages < 1:
        raise ValueError(f"reply_schema needs at least one passage, got {n_passages}")
    if n_passages == 1:
        return frame_schema(b)
    return {
        "type": "object",
        "properties": {"frames": {"type": "array", "items": frame_schema(b), "minItems": n_passages,
                                  "maxItems": n_passages}},
        "required": ["frames"],
        "additionalProperties": False,
    }


def session_line(session_time: datetime | None) -> str:
    if session_time is None:
        return "Session time: unknown"
    return f"Session time: {session_time:%Y-%m-%d %H:%M} ({session_time:%A})"


def passage_lines(speaker: str, text: str, caption: str | None) -> list[str]:
    """`[<speaker>]: <text>` and, for an image turn, an `[Image: <caption>]` line
    (docs/methods.md "SEEM: passages")."""
    lines = [f"[{speaker}]: {text}"]
    if caption:
        lines.append(f"[Image: {caption}]")
    return lines


def render_passages(session_time: datetime | None, passages: Sequence[tuple[str, str, str | None]]) -> str:
    """The user message shared by F_ext and quadruple extraction: time line, then passage(s)."""
    lines = [session_line(session_time)]
    if len(passages) == 1:
        lines.extend(passage_lines(*passages[0]))
        return "\n".join(lines)
    for i, p in enumerate(passages, start=1):
        lines.append(f"Message {i}:")
        lines.extend(passage_lines(*p))
    return "\n".join(lines)


def build_messages(session_time: datetime | None, passages: Sequence[tuple[str, str, str | None]]
                   ) -> tuple[Message, ...]:
    system = SYSTEM if len(passages) == 1 else SYSTEM_MANY
    return (Message("system", system), Message("user", render_passages(session_time, passages)))
