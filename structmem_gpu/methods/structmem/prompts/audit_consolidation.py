"""Consolidation fidelity audit prompt (StructMem paper Appendix A.6, Table 7).

A judge reads one window's buffer (the entries of the period), the related entries retrieved
for it, summary A (the buffer-only synthesis, K = 0) and summary B (the synthesis under test),
lists the cross-event links that B states and A does not, and classifies each as GROUNDED
(the listed entries support it) or SPURIOUS. Reply schema, bounded (maxItems, maxLength) so a
reply capped at max_tokens is still valid JSON:

    {"links": [{"link": "Biscuit's adoption follows the shelter plan of 2024-03-03",
                "verdict": "grounded"}]}

An empty list means B adds no cross-event link. Bump VERSION whenever the wording changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "audit_consolidation/1"
GROUNDED, SPURIOUS = "grounded", "spurious"
VERDICTS = (GROUNDED, SPURIOUS)

SYSTEM = """You audit memory summaries of a long conversation.
You get the entries of one period, related entries from other periods, summary A (written \
from the period's entries only) and summary B (written from the period's entries and the \
related entries).
List every cross-event link that summary B states and summary A does not: a statement that \
connects something in this period with another event (a shared experience, a cause, a \
follow-up, a change over time). Quote or paraphrase each link briefly.
Classify each link:
- grounded: the listed entries (this period or the related ones) support the connection;
- spurious: the entries do not support it (an invented event, date, cause or connection).
Reply with JSON {"links": [...]}; give an empty list when B adds no such link."""


def schema(max_links: int, link_chars: int) -> dict[str, Any]:
    """At most `max_links` links of at most `link_chars` characters, verdict after the link."""
    return {
        "type": "object",
        "properties": {
            "links": {
                "type": "array",
                "maxItems": max(1, max_links),
                "items": {
                    "type": "object",
                    "properties": {
                        "link": {"type": "string", "minLength": 1, "maxLength": max(1, link_chars)},
                        "verdict": {"type": "string", "enum": list(VERDICTS)},
                    },
                    "required": ["link", "verdict"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["links"],
        "additionalProperties": False,
    }


def render_user(
    buffer_lines: Sequence[str], context_lines: Sequence[str], summary_a: str, summary_b: str
) -> str:
    parts = ["Entries from this period:", *buffer_lines, "", "Related entries from other periods:"]
    parts.extend(context_lines) if context_lines else parts.append("(none)")
    parts += ["", "Summary A:", summary_a.strip() or "(empty)", "", "Summary B:", summary_b.strip()]
    return "\n".join(parts)


def build_messages(
    buffer_lines: Sequence[str], context_lines: Sequence[str], summary_a: str, summary_b: str
) -> tuple[Message, ...]:
    return (
        Message("system", SYSTEM),
        Message("user", render_user(buffer_lines, context_lines, summary_a, summary_b)),
    )
