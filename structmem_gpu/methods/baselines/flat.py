"""flat baseline: factual entries only, no relational perspective, no consolidation.

    python jobs/run.py method=flat benchmark=sample

The Flat Memory row of the StructMem paper's Table 2 (LightMem's flat mode: the factual
prompt, independent entries, no synthesis). Every build stage is StructMem's own, configured
by conf/method/flat.yaml (`extract.perspectives: [fact]`, `consolidate.enabled: false`), so
flat's extraction requests are byte-identical to StructMem's factual requests and the
response cache serves them to both. This module only adds the reader: the top
`retrieve.entries_k` entries, dated and grouped by speaker exactly as StructMem renders them,
without syntheses (`answer.prompt: flat`, methods/baselines/prompts/answer_flat.py). Rendered user message:

    Memories of Tomas:
    - [16 March 2024] Tomas adopted a beagle puppy named Biscuit.
    Question: What is the name of the dog Tomas adopted?

The shared answer stage imports this builder from `answer.prompt`
(conf/method/flat.yaml).
"""

from __future__ import annotations


import polars as pl

# The StructMem reader's entry rendering (order, de-duplication) is reused on purpose: the
# flat, graph and StructMem contexts must differ only in what memory they hold.
from structmem_gpu.config.job import JobConfig
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt, answer_protocol
from structmem_gpu.methods.structmem.context import (
    entry_lines,
    official_prompts,
    official_reader,
    official_reader_fingerprint,
    paper_prompts,
    reader_entries,
    with_update_view,
)
from structmem_gpu.methods.baselines.prompts import answer_flat as P
from structmem_gpu.eval.prompts.answer_structmem import MemoryLine

PROMPT_NAME = "flat"
OFFICIAL_READER = "ANSWER_PROMPT"  # LightMem's reader without event summaries


def build_prompts_fingerprint(job: JobConfig) -> str | None:
    """eval/answer.py: the official reader text's commit and hash when it is used."""
    return with_update_view(job, official_reader_fingerprint(job, OFFICIAL_READER))


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    """Retrieved entries (chronological, by speaker) per question; syntheses are ignored."""
    retrievals = inputs.require("retrievals", PROMPT_NAME)
    entries = reader_entries(inputs, PROMPT_NAME)  # update.read=post: the updated store
    qids = inputs.questions["question_id"].to_list()
    mine = retrievals.filter(pl.col("question_id").is_in(qids))
    if answer_protocol(inputs.job) == "paper":  # the StructMem reader, minus the summaries
        if official_reader(inputs.job):
            return official_prompts(inputs, mine, entries, OFFICIAL_READER, None)
        return paper_prompts(inputs, mine, entries, lambda q: [], None)
    lines = entry_lines(mine, entries, MemoryLine)
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        out[qid] = AnswerPrompt(P.build_messages(question, lines.get(qid, []), now), P.VERSION)
    return out


