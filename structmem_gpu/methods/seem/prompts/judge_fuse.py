"""SEEM associative fusion, one request: F_judge then F_fuse
(docs/methods.md "SEEM: fusion"; our wording).

The default fusion request: an earlier frame (the new frame's most similar one) and the new
frame, each with the messages behind it; the reply says whether both describe the same event
and, if so, the merged frame. One reply:

    {"same_event": true,
     "summary": "Tomas applied to adopt a rescue dog and brought Biscuit home two weeks later.",
     "events": [{"participants": ["Tomas"], "action": ["Tomas applied to adopt a dog"], ...},
                {"participants": ["Tomas"], "action": ["Tomas adopted Biscuit"], ...}]}

`FrameView` and `render_pair` are shared with seem_judge and seem_merge (the two-call
variant): bump all three VERSIONs when they change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.frame import FrameBounds, event_schema

VERSION = "seem_judge_fuse/1"

CRITERION = """Two memories describe the SAME event when they are the same happening or a direct \
continuation of it: a question and its answer, a follow-up on the same activity, a change in \
the status of the same plan. They are DIFFERENT when they only share a person or a topic but \
are about unrelated things."""

FUSE_RULES = """To merge: keep every event of both memories once (merge duplicates), keep the \
roles apart (action holds only subject-verb-object), order the events by time, and write a \
summary of at most 3 sentences that says how the situation developed. Use names, not pronouns."""

SYSTEM = f"""You maintain the episodic memory of a conversation.
{CRITERION}
{FUSE_RULES}
Reply with JSON only: {{"same_event": true or false, "summary": <merged summary, or null when \
different>, "events": [<merged events>] or null when different}}"""


@dataclass(frozen=True)
class FrameView:
    """A frame as a fusion prompt shows it: its rendering and the messages behind it."""

    rendering: str
    evidence: tuple[str, ...]  # "[Speaker, 2024-03-03 14:15] text" lines, already truncated


def render_view(title: str, view: FrameView) -> str:
    lines = [f"{title}:", view.rendering, "Messages behind it:"]
    lines.extend(f"- {e}" for e in view.evidence)
    return "\n".join(lines)


def render_pair(earlier: FrameView, new: FrameView) -> str:
    return "\n\n".join([render_view("Earlier memory", earlier), render_view("New memory", new)])


def reply_schema(b: FrameBounds, max_events: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "same_event": {"type": "boolean"},
            "summary": {"anyOf": [{"type": "string", "maxLength": b.summary_chars}, {"type": "null"}]},
            "events": {"anyOf": [{"type": "array", "items": event_schema(b), "maxItems": max_events},
                                 {"type": "null"}]},
        },
        "required": ["same_event", "summary", "events"],
        "additionalProperties": False,
    }


def build_messages(earlier: FrameView, new: FrameView) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render_pair(earlier, new)))


def evidence_line(speaker: str, when: str, text: str, max_chars: int) -> str:
    body = text if len(text) <= max_chars else text[: max(0, max_chars - 3)] + "..."
    return f"[{speaker}, {when}] {body}"

