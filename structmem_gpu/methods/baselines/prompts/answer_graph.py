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
from structmem_gpu.eval.prompts.answer_structmem import (
    MemoryLine,
    format_range,
    reader_messages,
    reader_system,
    render_memories,
)

VERSION = "answer_graph/1"

SYSTEM_RELATION_RULE = (
    'Relations link two entities ("source -> relation -> target"); use them to connect people, '
    "places and things that the memories mention separately."
)
SYSTEM = reader_system(SYSTEM_RELATION_RULE)


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
    return reader_messages(SYSTEM, render(entries, relations), question, now)
