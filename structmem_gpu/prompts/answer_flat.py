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
from structmem_gpu.prompts.answer_structmem import (
    NOT_MENTIONED,
    MemoryLine,
    current_date_line,
    render_memories,
)

VERSION = "answer_flat/1"

SYSTEM = f"""You answer a question about a long conversation using only the memories provided.
Rules:
- Every memory starts with the date of the event it comes from. Use that date to turn relative \
times into absolute dates: a memory dated 8 May 2023 that says "yesterday" means 7 May 2023, \
and "last year" means 2022.
- When memories contradict each other, trust the most recent one.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
memories' own words where you can.
- If the memories do not contain the answer, reply exactly: {NOT_MENTIONED}"""


def build_messages(
    question: str, entries: Sequence[MemoryLine], now: datetime | None = None
) -> tuple[Message, ...]:
    lines = [render_memories(entries, ())]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
