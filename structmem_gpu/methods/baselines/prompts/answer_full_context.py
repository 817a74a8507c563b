"""Answer prompt over the raw history (full_context baseline): dated sessions, newest first.

Own wording of LoCoMo's long-context reader (docs/evaluation.md "Reader conventions"): session
headers carry the date-time, turns are `Speaker: text` (image turns as
`<text> [image: <caption>]`), the answer is a short phrase. Sessions are listed newest first so
that truncation to the context budget drops the oldest ones (the builder in
methods/baselines/full_context.py decides what fits). Example:

    Conversation history (newest session first):
    Session 2 (7:05 pm on 17 March 2024):
    Tomas: Here he is on his first walk! [image: a photo of a small beagle puppy]
    Session 1 (...)
    Question: What is the name of the dog Tomas adopted?

`answer.history_order: flat` (StructMem Table 1 "OpenAI" as Appendix A.4 describes it: all
turns concatenated as flat text, no retrieval) shows every turn in the conversation's order
with no session header and no date (FLAT_SYSTEM, FLAT_HEADER, FLAT_VERSION).
"""

from __future__ import annotations

from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_structmem import (
    NOT_MENTIONED,
    current_date_line,
    format_date,
)

VERSION = "answer_full_context/1"

SYSTEM = f"""You answer a question about a long conversation using only the history provided.
Rules:
- Sessions are listed newest first; each header gives the session's date. Use it to turn \
relative times into absolute dates ("yesterday" in a session of 8 May 2023 means 7 May 2023).
- When the history contradicts itself, trust the most recent session.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
conversation's own words where you can.
- If the history does not contain the answer, reply exactly: {NOT_MENTIONED}"""

HEADER = "Conversation history (newest session first):"
TRUNCATED_NOTE = "(older sessions omitted to fit the context)"


FLAT_VERSION = "answer_full_context_flat/1"

FLAT_SYSTEM = f"""You answer a question about a long conversation using only the history provided.
Rules:
- The history is every turn of the conversation as one flat text, without sessions or dates.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
conversation's own words where you can.
- If the history does not contain the answer, reply exactly: {NOT_MENTIONED}"""

FLAT_HEADER = "Conversation history (every turn, flat text):"
FLAT_TRUNCATED_NOTE = "(earlier turns omitted to fit the context)"


def session_header(session_index: int, time: datetime | None) -> str:
    when = (
        "unknown date"
        if time is None
        else f"{time:%I:%M %p}".lstrip("0").lower() + f" on {format_date(time)}"
    )
    return f"Session {session_index} ({when}):"


def build_messages(question: str, history: str, now: datetime | None = None,
                   flat: bool = False) -> tuple[Message, ...]:
    """`history` is the already-rendered, already-truncated block of sessions (`flat`: of
    turns, answer.history_order=flat)."""
    lines = [FLAT_HEADER if flat else HEADER, history]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", FLAT_SYSTEM if flat else SYSTEM), Message("user", "\n".join(lines)))
