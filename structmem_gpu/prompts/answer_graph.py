"""Answer prompt over graph memory: dated factual entries plus knowledge-graph relations.

The Graph Memory row of the StructMem paper's Table 2. Entries render exactly as for flat
memory and StructMem (`answer_structmem.render_memories`); the relations touching entities of
the question follow, with the date range of the turns that stated them, and one extra rule
says how to use them. Example:

    Memories of Tomas:
    - [16 March 2024] Tomas adopted a beagle puppy named Biscuit.
    Relations between entities:
    - [17 March 2024] Tomas -> adopted -> Biscuit
    Question: What is the name of the dog Tomas adopted?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.prompts.answer_structmem import (
    NOT_MENTIONED,
    MemoryLine,
    current_date_line,
    format_range,
    render_memories,
)

VERSION = "answer_graph/1"

SYSTEM = f"""You answer a question about a long conversation using only the memories provided.
Rules:
- Every memory starts with the date of the event it comes from. Use that date to turn relative \
times into absolute dates: a memory dated 8 May 2023 that says "yesterday" means 7 May 2023, \
and "last year" means 2022.
- When memories contradict each other, trust the most recent one.
- Relations link two entities ("source -> relation -> target"); use them to connect people, \
places and things that the memories mention separately.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
memories' own words where you can.
- If the memories do not contain the answer, reply exactly: {NOT_MENTIONED}"""


@dataclass(frozen=True)
class RelationLine:
    start: datetime | None
    end: datetime | None
    text: str  # "source -> relation -> target"


def render(entries: Sequence[MemoryLine], relations: Sequence[RelationLine]) -> str:
    parts = [render_memories(entries, ())] if entries or not relations else []
    if relations:
        parts.append("Relations between entities:")
        parts.extend(f"- [{format_range(r.start, r.end)}] {r.text}" for r in relations)
    return "\n".join(parts)


def build_messages(
    question: str,
    entries: Sequence[MemoryLine],
    relations: Sequence[RelationLine],
    now: datetime | None = None,
) -> tuple[Message, ...]:
    lines = [render(entries, relations)]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
