"""Cross-event synthesis prompt (paper Eq. 6;
docs/methods.md "StructMem: consolidation" step 6).

Two variants: `constrained` (default: every instruction of the reference synthesis prompt,
the reference synthesis prompt, in our own words) and `unconstrained` (paper Fig. 20 / Table 7
ablation: the same text with its grounding lines deleted, nothing added; see `LINES`). The
reply is **free text** (no JSON schema): a narrative is prose, and free text cannot fail to parse when a small model runs into
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

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.types import Message

VERSION = "synthesis/3"  # 3: times cited where available; psychological changes kept
VARIANTS = ("constrained", "unconstrained")

_ROLE = (
    "You summarise long conversations with an eye for time: you write memory syntheses that "
    "connect one period of a conversation with related events from other periods."
)

# The instructions, one line each, in order. Each carries one point of the reference synthesis
# prompt (docs/methods.md "StructMem: consolidation"), in our own words. `True` marks a
# grounding line: the `unconstrained` variant (paper Fig. 20) is this text with exactly those
# lines deleted.
LINES: tuple[tuple[str, bool], ...] = (
    (
        "The user message gives the period's time range and people, the entries of the period "
        "(fact = what happened or was said; relation = how the people treated each other) and "
        "related entries from other periods. Write one narrative about the period.",
        False,
    ),
    ("- Keep both kinds of information: the facts and the patterns of interaction.", False),
    (
        "- Keep the concrete details: dates, times, places and the names of things; the "
        "emotional turning points and the shifts in how a person thinks or feels; concrete "
        "plans; and quotes that tell something about a person.",
        False,
    ),
    (
        "- Weave in earlier events or later plans from the related entries, with their dates.",
        False,
    ),
    (
        "- Use a related entry only when it bears directly on this period's topics and adds "
        "meaning to them.",
        True,
    ),
    (
        "- Remove repetition and tell the period in time order, so that the facts and the "
        "interactions unfold together.",
        False,
    ),
    (
        "- Bring out causal links, e.g. \"after Tomas lost his job in March, Lena offered to "
        "review his applications, and he got an interview within a week\".",
        False,
    ),
    (
        "- When you bring in an event from another period, name its specific time if the "
        "entries give one.",
        True,
    ),
    ("- Prefer concrete connections between events to general remarks about patterns.", True),
    (
        "- Work the related entries into the narrative itself; do not append them at the end.",
        False,
    ),
    ("- Balance the factual timeline with the relational dynamics.", False),
    (
        "- Write fluent, concise prose of 200-350 words. Reply with the narrative only.",
        False,
    ),
)


@dataclass(frozen=True)
class Record:
    """One entry as the synthesis prompt shows it."""

    time: datetime
    speaker: str
    kind: str  # "fact" | "relation"
    text: str


def prompt_version(variant: str) -> str:
    """'synthesis/3+constrained': the version recorded on requests and syntheses."""
    check_variant(variant)
    return f"{VERSION}+{variant}"


def check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ConfigError(
            f"consolidate.prompt_variant={variant!r}; expected one of {list(VARIANTS)}"
        )


def line(r: Record, stamp: str | None = None) -> str:
    """One entry as the prompt lists it (`stamp`: its time already formatted, see `lines`)."""
    return f"- [{stamp or _stamp(r.time)}] {r.speaker} ({r.kind}): {r.text}"


def _stamp(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M %a}"


def lines(records: Sequence[Record]) -> list[str]:
    """`line` of each record, each distinct time formatted once (a conversation's entries
    share their turns' times, and the date formatting was most of a line's cost)."""
    stamps = {t: _stamp(t) for t in {r.time for r in records}}
    return [line(r, stamps[r.time]) for r in records]


# Memoised for callers that render window by window (the dry run): an entry is listed in
# every window whose buffer or context holds it (20 per window on LongMemEval-S), and the date
# formatting dominated. The stage renders each entry once per conversation instead (user_message).
_line = functools.lru_cache(maxsize=1 << 16)(line)


def _period(start: datetime, end: datetime) -> str:
    if start == end:
        return f"{start:%Y-%m-%d %H:%M} ({start:%A})"
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} ({start:%A})"


@functools.lru_cache(maxsize=None)  # one text per variant, asked for once per window
def system_prompt(variant: str) -> str:
    """Role and instructions; identical for every window of a run, so servers reuse its KV cache."""
    check_variant(variant)
    keep = [text for text, grounding in LINES if variant == "constrained" or not grounding]
    return "\n\n".join([_ROLE, "\n".join(keep)])


def render_user(buffer: Sequence[Record], context: Sequence[Record]) -> str:
    """The user message: period header, the buffer, the related entries."""
    return user_message(buffer, [_line(r) for r in buffer], [_line(r) for r in context])


def user_message(buffer: Sequence[Record], buffer_lines: Sequence[str],
                 context_lines: Sequence[str]) -> str:
    """render_user with the entries' lines already rendered (`line`, once per entry of a
    conversation: the consolidate stage)."""
    if not buffer:
        raise ValueError("a synthesis needs at least one buffer entry")
    people = list(dict.fromkeys(r.speaker for r in buffer))
    parts = [
        f"Period: {_period(buffer[0].time, buffer[-1].time)}. People: {', '.join(people)}.",
        "",
        "Entries from this period:",
        *buffer_lines,
        "",
        "Related entries from other periods:",
    ]
    parts.extend(context_lines) if context_lines else parts.append("(none)")
    return "\n".join(parts)


def build_messages(
    variant: str, buffer: Sequence[Record], context: Sequence[Record]
) -> tuple[Message, ...]:
    return messages(variant, render_user(buffer, context))


def messages(variant: str, user: str) -> tuple[Message, ...]:
    """The system prompt and a rendered user message (render_user / user_message)."""
    return (Message("system", system_prompt(variant)), Message("user", user))
