"""Answer prompt over StructMem memory: dated entries grouped by speaker, dated syntheses.

Own wording of the reader described in docs/methods.md "StructMem: reader"
and paper A.7. The reply is free text (no schema): a short phrase, or "Not mentioned in the
conversation", which LoCoMo's category-5 rule accepts. Rendered user message, one example:

    Memories of Tomas:
    - [16 March 2024] Tomas adopted a beagle puppy named Biscuit.
    Memories of Ana:
    - [17 March 2024] Ana offered to walk Biscuit when Tomas travels.
    Event summaries:
    - [16 March 2024 to 17 March 2024] Tomas brought Biscuit home on 16 March 2024 ...
    Question: What is the name of the dog Tomas adopted?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.llm.types import Message

VERSION = "answer_structmem/1"
# The abstention phrase every answer prompt asks for; LoCoMo's cat-5 rule looks for "not mentioned".
NOT_MENTIONED = "Not mentioned in the conversation"

def reader_system(memory_rule: str | None) -> str:
    """The reader's rules, shared by every memory method's answer prompt so that methods differ
    only in the memory they show; `memory_rule` explains that method's extra memory kind."""
    rules = [
        "Every memory starts with the date of the event it comes from. Use that date to turn "
        'relative times into absolute dates: a memory dated 8 May 2023 that says "yesterday" '
        'means 7 May 2023, and "last year" means 2022.',
        "When memories contradict each other, trust the most recent one.",
        *([memory_rule] if memory_rule else []),
        "Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse "
        "the memories' own words where you can.",
        f"If the memories do not contain the answer, reply exactly: {NOT_MENTIONED}",
    ]
    head = "You answer a question about a long conversation using only the memories provided."
    return "\n".join([head, "Rules:", *(f"- {r}" for r in rules)])


SYSTEM = reader_system(
    "Event summaries link several events over a time range; use them for questions that need "
    "more than one event."
)


def reader_messages(system: str, memory: str, question: str, now: datetime | None) -> tuple[Message, ...]:
    """System rules + one user message: the memory, the current date (LongMemEval), the question."""
    lines = [memory]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", system), Message("user", "\n".join(lines)))


@dataclass(frozen=True)
class MemoryLine:
    """One retrieved entry as the reader sees it."""

    speaker: str
    time: datetime | None
    text: str


@dataclass(frozen=True)
class SynthesisLine:
    """One retrieved synthesis with the time range of its window."""

    start: datetime | None
    end: datetime | None
    text: str


def format_date(dt: datetime | None) -> str:
    """'8 May 2023' (no zero padding, locale-independent); '?' when unknown."""
    if dt is None:
        return "?"
    return f"{dt.day} {dt:%B} {dt.year}"


def format_range(start: datetime | None, end: datetime | None) -> str:
    a, b = format_date(start), format_date(end)
    return a if a == b else f"{a} to {b}"


def current_date_line(now: datetime | None) -> str | None:
    """LongMemEval's question date, given to the reader as today's date."""
    if now is None:
        return None
    return f"Current date: {now:%A}, {format_date(now)}"


def render_memories(entries: Sequence[MemoryLine], syntheses: Sequence[SynthesisLine]) -> str:
    """Entries grouped by speaker (groups in order of first appearance), then the syntheses."""
    groups: dict[str, list[MemoryLine]] = {}
    for e in entries:
        groups.setdefault(e.speaker or "unknown speaker", []).append(e)
    parts: list[str] = []
    for speaker, lines in groups.items():
        parts.append(f"Memories of {speaker}:")
        parts.extend(f"- [{format_date(e.time)}] {e.text}" for e in lines)
    if syntheses:
        parts.append("Event summaries:")
        parts.extend(f"- [{format_range(s.start, s.end)}] {s.text}" for s in syntheses)
    if not parts:
        parts.append("(no memories retrieved)")
    return "\n".join(parts)


def build_messages(
    question: str,
    entries: Sequence[MemoryLine],
    syntheses: Sequence[SynthesisLine],
    now: datetime | None = None,
) -> tuple[Message, ...]:
    return reader_messages(SYSTEM, render_memories(entries, syntheses), question, now)
