"""SEEM fusion, two-call variant, second call: F_fuse for a pair already judged the same event.

Same input as seem_judge_fuse; the reply is the merged frame (seem_frame.frame_schema with the
fusion event cap). One reply:

    {"summary": "Lena trained for the Riverside Half Marathon and finished it in 1:58.",
     "events": [{"participants": ["Lena"], "action": ["Lena ran the half marathon"], ...}]}
"""

from __future__ import annotations

from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.frame import FrameBounds, frame_schema
from structmem_gpu.methods.seem.prompts.judge_fuse import FUSE_RULES, FrameView, render_pair

VERSION = "seem_merge/1"

SYSTEM = f"""You maintain the episodic memory of a conversation. The two memories below \
describe the same event: merge them into one.
{FUSE_RULES}
Reply with JSON only: {{"summary": "...", "events": [...]}}"""


def reply_schema(b: FrameBounds, max_events: int) -> dict[str, Any]:
    schema = frame_schema(b)
    schema["properties"]["events"]["maxItems"] = max_events
    return schema


def build_messages(earlier: FrameView, new: FrameView) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render_pair(earlier, new)))
