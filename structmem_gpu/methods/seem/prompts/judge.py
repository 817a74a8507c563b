"""SEEM fusion, two-call variant, first call: F_judge alone (`seem.fusion.strict_two_call`).

Same input as seem_judge_fuse (an earlier frame and the new one, with their messages); the
reply only decides. The positives then get a seem_merge request in a second batch. One reply:

    {"same_event": false}
"""

from __future__ import annotations

from typing import Any

from structmem_gpu.llm.types import Message
from structmem_gpu.methods.seem.prompts.judge_fuse import CRITERION, FrameView, render_pair

VERSION = "seem_judge/1"

SYSTEM = f"""You maintain the episodic memory of a conversation.
{CRITERION}
Reply with JSON only: {{"same_event": true or false}}"""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"same_event": {"type": "boolean"}},
    "required": ["same_event"],
    "additionalProperties": False,
}


def build_messages(earlier: FrameView, new: FrameView) -> tuple[Message, ...]:
    return (Message("system", SYSTEM), Message("user", render_pair(earlier, new)))
