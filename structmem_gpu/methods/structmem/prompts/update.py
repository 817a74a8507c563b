"""Offline-update prompt (the reference's `update="offline"`; docs/methods.md "StructMem:
offline update"): one request per candidate entry, whose reply decides update / delete /
ignore.

With `prompts.sources.lightmem` set (the replication experiments) the system message is
LightMem's own `UPDATE_PROMPT` (src/lightmem/memory/prompts.py), read at run time from the
checkout (prompts/official.py) and never copied here; without it, `SYSTEM` below, our own
wording of the same decision. The user message has the reference's layout
(`LightMemory.offline_update_all_entries` -> `_call_update_llm`): the target memory on one
line, then one "- " line per candidate memory:

    Target memory:Caroline went to a pottery class on 2023-07-01.
    Candidate memories:
    - Caroline goes to pottery classes every Saturday since July 2023.

The reply is a JSON object {"action": "update" | "delete" | "ignore", "new_memory": "..."}
(new_memory only for update), schema-constrained (the reference asks for a JSON object and
reads `action`; a reply without one is "ignore" there, a reply that does not parse is retried
and then recorded as "ignore" with parse_ok=False here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "update/1"
ACTIONS = ("update", "delete", "ignore")
# The decision recorded for a reply that never parsed (the reference's fallback).
FALLBACK = "ignore"

SYSTEM = (
    "You keep a long-term memory store consistent. You get one target memory and newer "
    "memories that are very similar to it (the candidates). Decide what happens to the target:\n"
    "- update: the candidates refine, extend or correct it. Rewrite the target as one memory "
    "that keeps what is still true and adds what the candidates change or add.\n"
    "- delete: the target is wrong or obsolete given the candidates, or a candidate already "
    "says everything it says.\n"
    "- ignore: the target and the candidates are about different things, or the target needs "
    "no change.\n"
    'Reply with one JSON object: {"action": "update" | "delete" | "ignore", "new_memory": '
    '"<the rewritten target>"}; give new_memory only when the action is update.'
)


def user_message(target: str, candidates: Sequence[str]) -> str:
    """The reference's user message: the target memory, then one '- ' line per candidate."""
    lines = "\n".join(f"- {c}" for c in candidates)
    return f"Target memory:{target}\nCandidate memories:\n{lines}"


def build_messages(system: str, target: str, candidates: Sequence[str]) -> tuple[Message, ...]:
    return (Message("system", system), Message("user", user_message(target, candidates)))


def schema(max_chars: int) -> dict[str, Any]:
    """Reply schema: the action, and the rewritten memory (bounded by `max_chars`)."""
    return {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "new_memory": {"type": "string", "maxLength": int(max_chars)},
        },
        "required": ["action"],
        "additionalProperties": False,
    }


def decision(data: Any, parse_ok: bool) -> tuple[str, str | None]:
    """(action, new text or None) of a reply; a reply that did not parse is FALLBACK."""
    if not parse_ok or not isinstance(data, dict) or data.get("action") not in ACTIONS:
        return FALLBACK, None
    action = str(data["action"])
    text = data.get("new_memory")
    new = text.strip() if action == "update" and isinstance(text, str) and text.strip() else None
    return action, new
