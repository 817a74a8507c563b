"""SEEM windowed fusion (`seem.fusion.window` = w > 1; the author's "Strategy C",
docs/methods.md "SEEM: fusion").

A deviation from the paper that cuts the sequential depth by w: the next w new frames of a
conversation go into one request together with the earlier frames most similar to them; the
reply partitions the new frames into groups, each optionally joined to one earlier frame,
with the merged frame of every group. New frames left out of every group stay on their own.
One reply (new frames N1..N3, earlier frames M1..M2):

    {"groups": [{"new": [1, 2], "earlier": 1, "summary": "...", "events": [...]},
                {"new": [3], "earlier": null, "summary": "...", "events": [...]}]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.frame import FrameBounds, event_schema
from structmem_gpu.methods.seem.prompts.judge_fuse import (
    CRITERION,
    FUSE_RULES,
    FrameView,
    render_view,
)

VERSION = "seem_fuse_window/1"

SYSTEM = f"""You maintain the episodic memory of a conversation. You get earlier memories \
M1, M2, ... and new memories N1, N2, ... in time order.
{CRITERION}
Group the new memories that describe the same event. A group may also join ONE earlier memory \
that describes the same event. Each new memory belongs to at most one group; a new memory that \
matches nothing may be left out. For each group write the merged memory.
{FUSE_RULES}
Reply with JSON only: {{"groups": [{{"new": [numbers of the new memories], "earlier": <number \
of the earlier memory or null>, "summary": "...", "events": [...]}}]}}"""


def reply_schema(n_new: int, n_earlier: int, b: FrameBounds, max_events: int) -> dict[str, Any]:
    # Numbers as enums, not integer minimum/maximum: llama-cpp-python's grammar ignores integer
    # bounds, so only an enum keeps a constrained reply inside the valid range.
    earlier: dict[str, Any] = {"type": "null"}
    if n_earlier:
        earlier = {"anyOf": [{"enum": list(range(1, n_earlier + 1))}, {"type": "null"}]}
    group = {
        "type": "object",
        "properties": {
            "new": {"type": "array", "items": {"enum": list(range(1, n_new + 1))}, "minItems": 1, "maxItems": n_new},
            "earlier": earlier,
            "summary": {"type": "string", "maxLength": b.summary_chars},
            "events": {"type": "array", "items": event_schema(b), "maxItems": max_events},
        },
        "required": ["new", "earlier", "summary", "events"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"groups": {"type": "array", "items": group, "maxItems": n_new}},
        "required": ["groups"],
        "additionalProperties": False,
    }


def build_messages(earlier: Sequence[FrameView], new: Sequence[FrameView]) -> tuple[Message, ...]:
    parts = [render_view(f"Earlier memory M{i}", v) for i, v in enumerate(earlier, start=1)]
    if not parts:
        parts.append("Earlier memories: none")
    parts.extend(render_view(f"New memory N{i}", v) for i, v in enumerate(new, start=1))
    return (Message("system", SYSTEM), Message("user", "\n\n".join(parts)))
