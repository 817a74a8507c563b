"""Our reader over a baseline system's search results (`answer.prompt` of every system method).

The reader is ours, shared with the memory methods (eval/prompts/answer_structmem.reader_system:
same rules, short phrase, the abstention line), so a system row differs from ours only in the
memory it shows: each hit of `system_hits` in the system's rank order, grouped by whose memory
it is (mem0 keeps one store per speaker, as its evaluation harness does), each with the date
the system stored with it; a graph system's relations as their own lines. Example:

    Memories of Caroline:
    - [2023-05-08] Is researching adoption agencies
    Memories of Melanie:
    - [2023-05-08] Painted a sunset last week
    Question: What is Caroline researching?
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt
from structmem_gpu.eval.prompts.answer_structmem import reader_messages, reader_system
from structmem_gpu.llm.types import Message

VERSION = "answer_system/1"  # bump when the rendering changes
PROMPT_NAME = "system"
SYSTEM = reader_system(
    "Relations (subject -- relation -- object) come from a knowledge graph of the conversation; "
    "use them together with the memories.")


def _date(value: str | None) -> str:
    return (value or "undated")[:10]


# How each kind of hit is headed and written (a system's worker says which kind it returns):
# kind -> (block heading, whether a line carries its date).
KINDS = {
    "memory": ("Memories", True),  # mem0, LangMem, Zep's facts: one fact each, dated
    "relation": ("Relations", False),  # a graph's "subject -- relation -- object"
    "entity": ("Entities", False),  # Zep's entity summaries
    "passage": ("Passages", True),  # HippoRAG 2: retrieved turns
    "context": ("Retrieved context", False),  # LightRAG: one assembled context per question
    "synthesis": ("Syntheses", False),  # LightMem's cross-event summaries (lightmem_official)
}


def render(hits: pl.DataFrame) -> str:
    """One question's hits (rank order) as the reader's memory block."""
    if hits.height == 0:
        return "(no memories retrieved)"
    blocks: dict[str, list[str]] = {}
    for owner, kind, text, when in hits.select("owner", "kind", "text", "created_at").iter_rows():
        head, dated = KINDS.get(kind or "memory", (str(kind).capitalize(), True))
        if owner and kind in (None, "memory"):
            head = f"Memories of {owner}"
        if kind == "context":  # already a formatted block: shown as it is
            blocks.setdefault(head, []).append(text)
            continue
        line = f"- [{_date(when)}] {text}" if dated and when else f"- {text}"
        blocks.setdefault(head, []).append(line)
    return "\n".join(f"{head}:\n" + "\n".join(lines) for head, lines in blocks.items())


def build_prompts(inputs: AnswerInputs) -> Mapping[str, AnswerPrompt]:
    hits = inputs.require("system_hits", PROMPT_NAME).sort("question_id", "rank")
    by_q = {str(q): part for (q,), part in hits.group_by("question_id", maintain_order=True)}
    empty = hits.clear()
    return {
        qid: AnswerPrompt(reader_messages(SYSTEM, render(by_q.get(qid, empty)), question, now),
                          VERSION)
        for qid, question, now in inputs.questions.select(
            "question_id", "question", "question_time").iter_rows()
    }


OWN_READER_VERSION = "system_own_reader/1"  # the prompt is the system's; only the wrapping is ours


def own_reader(inputs: AnswerInputs) -> Mapping[str, AnswerPrompt]:
    """The system's own reader (`answer.prompt=structmem_gpu.systems.answer:own_reader`): per
    question the prompt its QA harness built from what it retrieved (`system_readers`, from
    the search reply's "readers"), sent as one system message, the reply as a whole the
    prediction (LightMem's search_locomo sends its prompt so, with no final-line rule)."""
    table = inputs.require("system_readers", "structmem_gpu.systems.answer:own_reader")
    prompts = dict(table.select("question_id", "prompt").iter_rows())
    missing = [q for q in inputs.questions["question_id"].to_list() if q not in prompts]
    if missing:
        raise ConfigError(
            f"answer.prompt=structmem_gpu.systems.answer:own_reader: the system returned no "
            f"reader prompt for {len(missing)} question(s) (first: {missing[0]}); its worker "
            f"builds none: use answer.prompt=structmem_gpu.systems.answer:build_prompts")
    return {qid: AnswerPrompt((Message("system", prompts[qid]),), OWN_READER_VERSION,
                              raw_reply=True)
            for qid in inputs.questions["question_id"].to_list()}
