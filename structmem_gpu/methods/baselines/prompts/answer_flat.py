"""Answer prompt over flat memory: dated factual entries grouped by speaker, nothing else.

The Flat Memory row of the StructMem paper's Table 2: the same reader as StructMem's
(`answer_structmem`: same rules, same entry rendering) minus the event summaries, so that a
difference between the two rows comes from the memory, not from the instructions. Example:

    Memories of Tomas:
    - [16 March 2024] Tomas adopted a beagle puppy named Biscuit.
    Question: What is the name of the dog Tomas adopted?
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_structmem import (
    MemoryLine,
    reader_messages,
    reader_system,
    render_memories,
)

VERSION = "answer_flat/1"

SYSTEM = reader_system(None)


def build_messages(
    question: str, entries: Sequence[MemoryLine], now: datetime | None = None
) -> tuple[Message, ...]:
    return reader_messages(SYSTEM, render_memories(entries, ()), question, now)
