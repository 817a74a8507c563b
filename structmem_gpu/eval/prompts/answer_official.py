"""Reader, protocol `paper`, with the official LightMem reader text (`prompts.sources.lightmem`):
the prompt LightMem's `experiments/locomo/search_locomo.py` builds
(`build_prompt_with_speaker_memories`, `format_related_memories`, `format_summaries`), filled
from our retrieved entries and syntheses. The template is read from the user's checkout
(prompts/official.py), never stored here.

As in the reference: the entries are grouped by speaker in order of first appearance in the
ranking (rank order inside a group), the first two groups fill the template's two speaker slots
("Speaker 2" / "No memories available." when fewer), each memory is
`[Memory recorded on: <DD Month YYYY>, <weekday>]` then its text, memories are separated by a
blank line, summaries are one per line ("No session summaries available." when none), and
the whole prompt is ONE system message. The template asks for no final `Answer:` line, so the
reply as a whole is the prediction (eval/answer.py), as the reference uses it.
"""

from __future__ import annotations

from collections.abc import Sequence

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.answer_paper import PaperEntry
from structmem_gpu.prompts.official import READERS, OfficialText

NO_MEMORIES = "No memories available."
NO_SUMMARIES = "No session summaries available."
UNKNOWN_SPEAKER = "Unknown"


def memory(e: PaperEntry) -> str:
    """One memory as format_related_memories writes it (an unknown date leaves the fields empty,
    where the reference has none to miss)."""
    date = f"{e.time:%d %B %Y}" if e.time is not None else ""
    weekday = f"{e.time:%a}" if e.time is not None else ""
    return f"[Memory recorded on: {date}, {weekday}]\n{e.text}".strip()


def memories(entries: Sequence[PaperEntry]) -> str:
    return "\n\n".join(memory(e) for e in entries)


def fields(
    question: str, entries: Sequence[PaperEntry], summaries: Sequence[str] | None
) -> dict[str, str]:
    groups: dict[str, list[PaperEntry]] = {}
    for e in entries:
        groups.setdefault(e.speaker or UNKNOWN_SPEAKER, []).append(e)
    names = list(groups)
    out = {
        "speaker_1_name": names[0] if names else "Speaker 1",
        "speaker_1_memories": memories(groups[names[0]]) if names else NO_MEMORIES,
        "speaker_2_name": names[1] if len(names) > 1 else "Speaker 2",
        "speaker_2_memories": memories(groups[names[1]]) if len(names) > 1 else NO_MEMORIES,
        "question": question,
    }
    if summaries is not None:
        out["session_summaries"] = "\n".join(summaries) if summaries else NO_SUMMARIES
    return out


def build_messages(
    template: OfficialText,
    question: str,
    entries: Sequence[PaperEntry],
    summaries: Sequence[str] | None,
) -> tuple[Message, ...]:
    """The filled template as one system message; `summaries` None = a reader without the
    summary block (ANSWER_PROMPT)."""
    wanted = READERS[template.name]
    values = fields(question, entries, summaries if "session_summaries" in wanted else None)
    return (Message("system", template.text.format(**{k: values[k] for k in wanted})),)
