"""Extraction fidelity audit prompt (StructMem paper Appendix A.6, Table 6).

A judge reads the extraction window an entry came from (the turns of one session that went
out in the same `extract` request, plus any read-only context turns), the entry's source turn,
and the entry itself, and labels the entry SUPPORTED or UNSUPPORTED. The reply schema puts a
bounded `reason` BEFORE the `label` enum, so the judge states why before committing and a reply
capped at max_tokens is still valid JSON. Example reply:

    {"reason": "Turn 2 says Tomas adopted Biscuit.", "label": "SUPPORTED"}

Bump VERSION whenever the wording or the user-message layout changes (cache keys use it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "audit_extraction/1"
POSITIVE, NEGATIVE = "SUPPORTED", "UNSUPPORTED"
LABELS = (POSITIVE, NEGATIVE)

SYSTEM = """You check memories that were extracted from a conversation.
You get an excerpt of one conversation session, the source turn the memory was taken from, \
and the memory (a fact about what happened, or a relation between people or events).
Label the memory:
- SUPPORTED when the source turn, read together with the excerpt, states or directly implies \
everything the memory says. Paraphrase is fine, and so is a date computed from the session \
date and a relative expression ("yesterday").
- UNSUPPORTED when the memory adds something the conversation does not say: another person, \
place, date, number, outcome or feeling, or a claim attributed to the wrong speaker.
Reply with JSON: first one short sentence of reason, then the label (SUPPORTED or UNSUPPORTED)."""


def schema(reason_chars: int) -> dict[str, Any]:
    """Reason before label; the reason is bounded so a capped reply still fits max_tokens."""
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "maxLength": max(1, reason_chars)},
            "label": {"type": "string", "enum": list(LABELS)},
        },
        "required": ["reason", "label"],
        "additionalProperties": False,
    }


def render_user(
    session_time: datetime,
    excerpt: Sequence[tuple[str, str]],
    source_index: int,
    kind: str,
    entry_text: str,
) -> str:
    """Excerpt lines numbered [1..n]; `source_index` (1-based) names the source turn."""
    lines = [f"Session date: {session_time:%Y-%m-%d %H:%M} ({session_time:%A})", "", "Excerpt:"]
    lines.extend(f"[{i}] {speaker}: {text}" for i, (speaker, text) in enumerate(excerpt, start=1))
    speaker, text = excerpt[source_index - 1]
    lines += [
        "",
        f"Source turn: [{source_index}] {speaker}: {text}",
        "",
        f"Memory ({kind}): {entry_text}",
    ]
    return "\n".join(lines)


def build_messages(
    session_time: datetime,
    excerpt: Sequence[tuple[str, str]],
    source_index: int,
    kind: str,
    entry_text: str,
) -> tuple[Message, ...]:
    if not 1 <= source_index <= len(excerpt):
        raise ValueError(f"source turn {source_index} is outside the excerpt (1..{len(excerpt)})")
    return (
        Message("system", SYSTEM),
        Message("user", render_user(session_time, excerpt, source_index, kind, entry_text)),
    )
