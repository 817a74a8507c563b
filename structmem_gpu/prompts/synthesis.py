"""Cross-event synthesis prompt (paper Eq. 6; specs/structmem.md "Stage consolidate" step 6).

Two variants: `constrained` (default: keep details, cite the date of every linked event, only
links the entries support, no speculation) and `unconstrained` (paper Table 7 ablation: the
citation and grounding requirements are dropped). The reply is **free text** (no JSON schema):
a narrative is prose, and free text cannot fail to parse when a small model runs into
`max_tokens` (a cut reply is kept; requests.parquet records finish_reason="length").

Rendered user message, abridged:

    Period: 2024-03-17 19:05 to 2024-03-17 19:48 (Sunday). People: Tomas, Lena.

    Entries from this period:
    - [2024-03-17 19:05 Sun] Tomas (fact): Tomas brought his beagle puppy Biscuit home on 2024-03-16.
    - [2024-03-17 19:05 Sun] Lena (relation): Lena congratulated Tomas on adopting Biscuit.

    Related entries from other periods:
    - [2024-03-03 14:15 Sun] Tomas (fact): Tomas planned to adopt a dog from a shelter.

The instructions (`system_prompt(variant)`) are the system message: identical for every window,
so llama.cpp and vLLM reuse their prefix KV cache across the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.errors import ConfigError
from structmem_gpu.llm.types import Message

VERSION = "synthesis/1"
VARIANTS = ("constrained", "unconstrained")

_ROLE = (
    "You write memory syntheses: short narratives that connect what happened in one "
    "period of a long conversation with related events from other periods."
)

_COMMON = """The user message lists the entries of one period (fact = what happened or was said; \
relation = how the people reacted to each other or how events connect) and related entries \
from other periods. Write one narrative of 200-350 words about the period.
- Keep both kinds of memory: what happened and how the people interacted.
- Keep concrete details: dates, places, names, titles, numbers, plans, and the moments where \
someone's feelings or plans changed.
- Tell the period in time order, without repeating yourself."""

_CONSTRAINED = """
- Link the period to a related entry from another period only where the entries directly \
support the link: a shared experience, a cause, a follow-up, a change over time. Give the date \
of every event you link to, e.g. "(2023-04-12)".
- Work the linked events into the narrative where they matter; do not list them at the end.
- Prefer concrete connections to general remarks about personality.
- Add nothing the entries do not say: no speculation, no guessed motives or outcomes.
Reply with the narrative only."""

_UNCONSTRAINED = """
- Connect the period with the related entries from other periods (shared experiences, \
causes, follow-ups, changes over time) wherever you see a connection.
Reply with the narrative only."""


@dataclass(frozen=True)
class Record:
    """One entry as the synthesis prompt shows it."""

    time: datetime
    speaker: str
    kind: str  # "fact" | "relation"
    text: str


def prompt_version(variant: str) -> str:
    """'synthesis/1+constrained': the version recorded on requests and syntheses."""
    check_variant(variant)
    return f"{VERSION}+{variant}"


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ConfigError(
            f"consolidate.prompt_variant={variant!r}; expected one of {list(VARIANTS)}"
        )


def _line(r: Record) -> str:
    return f"- [{r.time:%Y-%m-%d %H:%M %a}] {r.speaker} ({r.kind}): {r.text}"


def _period(start: datetime, end: datetime) -> str:
    if start == end:
        return f"{start:%Y-%m-%d %H:%M} ({start:%A})"
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({start:%A})"


def system_prompt(variant: str) -> str:
    """Role and instructions; identical for every window of a run, so servers reuse its KV cache."""
    check_variant(variant)
    return "\n\n".join(
        [_ROLE, _COMMON + (_CONSTRAINED if variant == "constrained" else _UNCONSTRAINED)]
    )


def render_user(buffer: Sequence[Record], context: Sequence[Record]) -> str:
    """The user message: period header, the buffer, the related entries."""
    if not buffer:
        raise ValueError("a synthesis needs at least one buffer entry")
    people = list(dict.fromkeys(r.speaker for r in buffer))
    parts = [
        f"Period: {_period(buffer[0].time, buffer[-1].time)}. People: {', '.join(people)}.",
        "",
        "Entries from this period:",
        *(_line(r) for r in buffer),
        "",
        "Related entries from other periods:",
    ]
    parts.extend(_line(r) for r in context) if context else parts.append("(none)")
    return "\n".join(parts)


def build_messages(
    variant: str, buffer: Sequence[Record], context: Sequence[Record]
) -> tuple[Message, ...]:
    return (
        Message("system", system_prompt(variant)),
        Message("user", render_user(buffer, context)),
    )
