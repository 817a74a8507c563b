"""SEEM QA prompt (our wording): facts, episodic memories, excerpts, question.

docs/methods.md "SEEM: QA context" describes the context.

The reader gets the filtered facts K_top, the frames E_ret and the passages P_final in
chronological order; the reply is free text, a short phrase or "Not mentioned in the
conversation" (LoCoMo's category-5 rule looks for "not mentioned"). Rendered user message:

    Relevant facts (subject | relation | object | time):
    - tomas | adopted | biscuit | 2024-03-16
    Episodic memories:
    [Memory 1] session 2, 2024-03-17
    Summary: Tomas adopted a beagle puppy named Biscuit.
    Conversation excerpts (chronological):
    [session 2, 7:05 pm on 17 March, 2024] Tomas: Here he is on his first walk! [image: ...]
    Question: What is the name of the dog Tomas adopted?
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED, current_date_line

VERSION = "seem_answer/1"

SYSTEM = f"""You answer a question about a long conversation using only the memory provided: \
facts, episodic memories (summaries of events with their roles) and excerpts of the \
conversation, each with its session date.
Rules:
- Turn relative times into absolute dates using the date of the session they were said in: \
"yesterday" in a session of 8 May 2023 means 7 May 2023, "last year" means 2022.
- When the memory contradicts itself, trust the most recent session.
- Answer with a short phrase (a name, a few words or a date), not a full sentence. Reuse the \
memory's own words where you can.
- If the memory does not contain the answer, reply exactly: {NOT_MENTIONED}"""


def format_time(dt: datetime | None) -> str:
    """LoCoMo's style, '1:56 pm on 8 May, 2023'; '?' when unknown."""
    if dt is None:
        return "?"
    hour = dt.hour % 12 or 12
    return f"{hour}:{dt.minute:02d} {'am' if dt.hour < 12 else 'pm'} on {dt.day} {dt:%B}, {dt.year}"


def render_context(facts: Sequence[str], frames: Sequence[str], passages: Sequence[str]) -> str:
    parts: list[str] = []
    if facts:
        parts.append("Relevant facts (subject | relation | object | time):")
        parts.extend(f"- {f}" for f in facts)
    if frames:
        parts.append("Episodic memories:")
        parts.extend(frames)
    if passages:
        parts.append("Conversation excerpts (chronological):")
        parts.extend(passages)
    return "\n".join(parts) if parts else "(no memory retrieved)"


def build_messages(question: str, facts: Sequence[str], frames: Sequence[str], passages: Sequence[str],
                   now: datetime | None = None) -> tuple[Message, ...]:
    lines = [render_context(facts, frames, passages)]
    today = current_date_line(now)
    if today:
        lines.append(today)
    lines.append(f"Question: {question}")
    return (Message("system", SYSTEM), Message("user", "\n".join(lines)))
