"""Reader, protocol `paper`: the StructMem reference reader
(docs/methods.md "StructMem: reader").

Own wording of the reference reader's instructions (Mem0's LoCoMo answer prompt plus a
block of event summaries): read both speakers' memories and attend to their timestamps; look
for direct evidence; prefer the most recent memory on a contradiction; turn relative times
into absolute dates from the memory's date (one worked example); do not take people who are
only mentioned for the speakers; answer in fewer than 5-6 words; think step by step and show
any date arithmetic. The whole prompt is ONE system message, as in the reference. The line
asking for "Not mentioned in the conversation" appears only when the run selects LoCoMo
category 5 or LongMemEval abstention questions (categories 1-4 are all answerable).

The reply is reasoning followed by a last line `Answer: <short answer>`; `split_reply` takes
that short answer as the prediction and keeps the reasoning for its own column. A reply with
no such line (e.g. cut by max_tokens) is the prediction as a whole, as the reference uses the
raw reply. Rendered memory block (layout `speakers`: the first two speaker groups in order of
first appearance in the ranking, rank order inside a group):

    Memories of Tomas:
    - (recorded on 16 March 2024, Sat) Tomas adopted a beagle puppy named Biscuit.
    Memories of Ana:
    - (recorded on 17 March 2024, Sun) Ana offered to walk Biscuit when Tomas travels.
    Event summaries:
    - Tomas brought Biscuit home and Ana ...
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED, current_date_line

VERSION = "answer_paper/1"
# Entry layouts: speakers = the reference (by speaker, first MAX_GROUPS groups, rank order);
# rank = one list in rank order, each line naming its speaker.
LAYOUTS = ("speakers", "rank")
MAX_GROUPS = 2  # the reference keeps only the first two speaker groups
_FINAL = re.compile(
    r"^[ \t*#>-]*(?:final\s+)?answer\s*[:：]\s*(.*)$", re.IGNORECASE | re.MULTILINE
)

_INSTRUCTIONS = """You are a helpful assistant. You answer a question about a long conversation \
between two people, using memories that were extracted from it.

# What you get
Memories of both speakers, each marked with the date it was recorded on, and summaries of \
related events.{memory_note}

# Instructions
1. Read the memories of both speakers carefully.
2. Pay close attention to the dates: they tell you when each thing happened.
3. When the question asks about a particular event or fact, look for memories that state it \
directly.
4. When memories contradict each other, go with the most recent one.
5. When a memory uses a relative time ("last year", "two months ago", "next Friday"), work out \
the actual date from the date the memory was recorded on. Example: a memory recorded on \
12 March 2023 that says "moved to Lisbon two years ago" means the move was in 2021.
6. Always give times as specific dates, months or years, never as relative expressions.
7. People are often named in the memories without being one of the two speakers; do not \
confuse them with the speakers.
8. Keep the answer shorter than 5-6 words.{abstain}

# How to work (think step by step)
1. Pick out the memories that bear on the question.
2. Check their dates and what they say.
3. Look for explicit dates, times, places or events that answer the question.
4. If the answer needs a calculation, such as a date from a relative time, write the \
arithmetic out.
5. Form a precise, short answer from the evidence alone.
6. Check that it answers what was asked.
7. Make sure it is specific and contains no vague time reference.

Write your reasoning first. End with one last line of the form
Answer: <the short answer>

{memory}
{today}Question: {question}"""


@dataclass(frozen=True)
class PaperEntry:
    """One retrieved entry, in rank order."""

    speaker: str
    time: datetime | None
    text: str


def recorded_on(dt: datetime | None) -> str:
    """'8 May 2023, Mon' (day, month name, year, weekday); 'unknown date' when unknown."""
    if dt is None:
        return "unknown date"
    return f"{dt.day} {dt:%B} {dt.year}, {dt:%a}"


def render_entries(
    entries: Sequence[PaperEntry], layout: str = "speakers", max_groups: int = MAX_GROUPS
) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"answer.entry_layout={layout!r}; expected one of {list(LAYOUTS)}")
    if not entries:
        return "(no memories retrieved)"
    if layout == "rank":
        lines = ["Memories (most relevant first):"]
        lines += [f"- (recorded on {recorded_on(e.time)}) {e.speaker}: {e.text}" for e in entries]
        return "\n".join(lines)
    groups: dict[str, list[PaperEntry]] = {}
    for e in entries:
        name = e.speaker or "unknown speaker"
        if name in groups or len(groups) < max_groups:
            groups.setdefault(name, []).append(e)
    lines = []
    for speaker, items in groups.items():
        lines.append(f"Memories of {speaker}:")
        lines += [f"- (recorded on {recorded_on(e.time)}) {e.text}" for e in items]
    return "\n".join(lines)


def render_summaries(texts: Sequence[str]) -> str:
    """Syntheses as plain text, one per line, without their time ranges (as the reference)."""
    if not texts:
        return ""
    return "\n".join(["Event summaries:", *(f"- {t}" for t in texts)])


def build_messages(
    question: str,
    memory_blocks: Sequence[str],
    now: datetime | None = None,
    abstain: bool = False,
    memory_note: str | None = None,
) -> tuple[Message, ...]:
    """One system message holding the instructions, the memory and the question."""
    today = current_date_line(now)
    text = _INSTRUCTIONS.format(
        memory_note=f" {memory_note}" if memory_note else "",
        abstain=(
            f"\n9. If the memories do not contain the answer, answer exactly: {NOT_MENTIONED}"
            if abstain
            else ""
        ),
        memory="\n".join(b for b in memory_blocks if b),
        today=f"{today}\n" if today else "",
        question=question,
    )
    return (Message("system", text),)


def has_final_line(text: str) -> bool:
    """Whether the reply reached its `Answer: ...` line (False: cut early or off-format)."""
    return any(m.group(1).strip() for m in _FINAL.finditer(text or ""))


def split_reply(text: str) -> tuple[str, str | None]:
    """(prediction, reasoning): the text after the last `Answer:` line, and what precedes it.

        >>> split_reply("Biscuit came home on 16 March.\\nAnswer: Biscuit")
        ('Biscuit', 'Biscuit came home on 16 March.')
        >>> split_reply("Biscuit")
        ('Biscuit', None)
    """
    text = (text or "").strip()
    last = None
    for last in _FINAL.finditer(text):
        pass
    if last is None or not last.group(1).strip():
        return text, None
    reasoning = text[: last.start()].strip()
    return last.group(1).strip().strip("*").strip(), (reasoning or None)
