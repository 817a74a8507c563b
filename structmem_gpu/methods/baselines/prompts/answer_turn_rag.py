"""Answer prompt over retrieved raw turns (turn_rag baseline): dated turns, in time order.

No memory is built: the reader sees the `retrieve.turns_k` turns most similar to the question,
chronological, each with its session date and speaker (image turns as
`<text> [image: <caption>]`). Same rules as the memory readers. Example:

    Conversation excerpts (oldest first):
    - [17 March 2024] Tomas: Here he is on his first walk! [image: a photo of a small beagle puppy]
    Question: What is the name of the dog Tomas adopted?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_structmem import (
    NOT_MENTIONED,
    current_date_line,
    format_date,
)

VERSION = "answer_turn_rag/1"

SYSTEM = f"""You answer a question about a long conversation using only the excerpts provided.
Rules:
- Every excerpt starts with the date of its session. Use that date to turn relative times into \
absolute dates: an excerpt dated 8 May 2023 that says "yesterday" means 7 May 2023, and \
"last year" means 2022.
- When excerpts contradict each other, trust the most recent one.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
conversation's own words where you can.
- If the excerpts do not contain the answer, reply exactly: {NOT_MENTIONED}"""

HEADER = "Conversation excerpts (oldest first):"


@dataclass(frozen=True)
class TurnLine:
    time: datetime | None
    speaker: str
    text: str  # display text (caption folded in)


def render(turns: Sequence[TurnLine]) -> str:
    if not turns:
        return "(no excerpts retrieved)"
    return "\n".join([HEADER, *(f"- [{format_date(t.time)}] {t.speaker}: {t.text}" for t in turns)])


def embed_text(time: datetime | None, speaker: str, text: str) -> str:
    """The text a turn is embedded as: date and speaker included, so "when"/"who" questions
    can match them (`2024-03-17 Tomas: Here he is ...`)."""
    when = "" if time is None else f"{time:%Y-%m-%d} "
    return f"{when}{speaker}: {text}"


def build_messages(
    question: str, turns: Sequence[TurnLine], now: datetime | None = None
) -> tuple[Message, ...]:
    lines = [render(turns)]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
