"""StructMem's reader context for the shared answer stage (conf/method/structmem.yaml sets
`answer.prompt` to this module's `build_prompts`).

Protocol `paper` (default): retrieved entries by speaker (answer.entry_layout /
answer.speaker_groups, rank order) plus the retrieved syntheses as plain lines
(eval/prompts/answer_paper.py); `reasoned`: chronological entries under dates and dated syntheses
(eval/prompts/answer_structmem.py). `paper_prompts` and `entry_lines` are shared with the flat and
graph-memory readers, which show StructMem's entries too. A `paper` prompt over the answer
model's context drops its lowest-ranked entries and syntheses first until it fits
(eval/context_fit.py); ordinary prompts are unchanged.

With a LightMem source (`prompts.sources.lightmem`, docs/evaluation.md "Official texts") the `paper` reader
of a LoCoMo-format benchmark is LightMem's own text instead: `ANSWER_PROMPT_StructMem` here,
`ANSWER_PROMPT` for flat (eval/prompts/answer_official.py); the graph reader keeps ours.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.eval.answer import (
    AnswerInputs, AnswerPrompt, AnswerSettings, answer_protocol,
)
from structmem_gpu.eval.context_fit import fit_prompt, keep_top, reader_fits, trim_note
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.methods.structmem.update_view import qa_entries, view_fingerprint
from structmem_gpu.prompts import official
from structmem_gpu.prompts.official import source_spec

log = logging.getLogger(__name__)

PROMPT_NAME = "structmem"
OFFICIAL_READER = "ANSWER_PROMPT_StructMem"  # LightMem's StructMem reader (--enable-summary)
LOCOMO_BENCHMARKS = ("locomo", "sample")  # the official reader's benchmark format


def build_prompts_fingerprint(job: JobConfig) -> str | None:
    """eval/answer.py: the official reader text's commit and hash when it is used."""
    return with_update_view(job, official_reader_fingerprint(job, OFFICIAL_READER))


def with_update_view(job: JobConfig, fp: str | None) -> str | None:
    """A reader fingerprint plus the offline update's QA view (update.read=post); unchanged
    for the pre store."""
    view = view_fingerprint(job)
    return fp if view is None else stable_hash(fp, view)


def reader_entries(inputs: AnswerInputs, prompt: str) -> pl.DataFrame:
    """The entries table as QA reads it (update.read=post: the updated store)."""
    return qa_entries(inputs.job, inputs.require("entries", prompt), inputs.table("entry_updates"))


def official_reader(job: JobConfig) -> bool:
    """Whether the reader uses LightMem's official text: a LightMem source, protocol paper and
    a LoCoMo-format benchmark (the text is LightMem's LoCoMo reader; LongMemEval keeps ours)."""
    return (source_spec(job, "lightmem") is not None and answer_protocol(job) == "paper"
            and job.root.benchmark.name in LOCOMO_BENCHMARKS)


def official_reader_fingerprint(job: JobConfig, reader: str) -> str | None:
    spec = source_spec(job, "lightmem")
    if spec is None or not official_reader(job):
        return None
    return official.fingerprint({"reader": official.lightmem_reader(spec, reader)})


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    """Entries grouped by speaker and syntheses per question, in the configured protocol."""
    retrievals = inputs.require("retrievals", PROMPT_NAME)
    entries = reader_entries(inputs, PROMPT_NAME)
    syntheses = inputs.table("syntheses")
    qids = set(inputs.questions["question_id"].to_list())
    retrievals = retrievals.filter(pl.col("question_id").is_in(list(qids)))
    if answer_protocol(inputs.job) == "paper":
        texts = synthesis_texts(retrievals, syntheses)
        if official_reader(inputs.job):
            return official_prompts(inputs, retrievals, entries, OFFICIAL_READER, texts)
        return paper_prompts(inputs, retrievals, entries, lambda q: [texts.get(q, [])], None)
    from structmem_gpu.eval.prompts import answer_structmem as P

    lines = entry_lines(retrievals, entries, P.MemoryLine)
    synths = _synthesis_lines(retrievals, syntheses, P.SynthesisLine)
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        msgs = P.build_messages(question, lines.get(qid, []), synths.get(qid, []), now)
        out[qid] = AnswerPrompt(msgs, P.VERSION)
    return out


def paper_prompts(
    inputs: AnswerInputs,
    retrievals: pl.DataFrame,
    entries: pl.DataFrame,
    extra: Callable[[str], list[Any]],
    memory_note: str | None,
) -> dict[str, AnswerPrompt]:
    """Reader `paper` prompts: the entry block (answer.entry_layout) plus `extra(qid)` — a
    list of already-rendered blocks, or lists of synthesis texts — per question."""
    from structmem_gpu.eval.prompts import answer_paper as A

    a = inputs.job.settings(AnswerSettings)  # checks entry_layout's choices, speaker_groups >= 1
    layout, groups = a.entry_layout, a.speaker_groups
    ranked = ranked_entries(retrievals, entries, A.PaperEntry)
    abstain = inputs.abstain()
    fits = reader_fits(inputs.job)
    out: dict[str, AnswerPrompt] = {}
    trimmed = 0
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        top, extras = ranked.get(qid, []), extra(qid)

        def build(share: float) -> Any:
            # Over the model's context: the lowest-ranked entries and syntheses go first,
            # the same share of each list (rendered blocks stay whole).
            blocks = [A.render_entries(keep_top(top, share), layout, groups)]
            for b in extras:
                kept = A.render_summaries(keep_top(b, share)) if isinstance(b, list) else str(b)
                blocks.append(kept)
            return A.build_messages(question, blocks, now, abstain, memory_note)

        msgs, cut = fit_prompt(build, fits)
        trimmed += cut
        out[qid] = AnswerPrompt(msgs, A.VERSION, reasoned_reply=True)
    if note := trim_note("answer", trimmed, len(out)):
        log.warning("%s (lowest-ranked entries and syntheses dropped)", note)
    return out


def official_prompts(
    inputs: AnswerInputs,
    retrievals: pl.DataFrame,
    entries: pl.DataFrame,
    reader: str,
    summaries: dict[str, list[str]] | None,
) -> dict[str, AnswerPrompt]:
    """Reader `paper` with the official LightMem reader text `reader` (eval/prompts/answer_official.py):
    its two speaker slots replace answer.entry_layout / speaker_groups, and the reply as a whole
    is the prediction (the template has no final-line instruction)."""
    from structmem_gpu.eval.prompts import answer_official as O
    from structmem_gpu.eval.prompts.answer_paper import MAX_GROUPS, PaperEntry

    a = inputs.job.settings(AnswerSettings)
    layout, groups = a.entry_layout, a.speaker_groups
    if layout != "speakers" or groups != MAX_GROUPS:
        raise ConfigError(
            f"answer.entry_layout={layout} / answer.speaker_groups={groups}: the official reader "
            f"{reader} (prompts.sources.lightmem) has two speaker slots; use speakers / 2"
        )
    spec = source_spec(inputs.job, "lightmem")
    assert spec is not None
    template = official.lightmem_reader(spec, reader)
    ranked = ranked_entries(retrievals, entries, PaperEntry)
    out: dict[str, AnswerPrompt] = {}
    for qid, question in inputs.questions.select("question_id", "question").iter_rows():
        summ = None if summaries is None else summaries.get(qid, [])
        msgs = O.build_messages(template, question, ranked.get(qid, []), summ)
        out[qid] = AnswerPrompt(msgs, template.version("reader"), raw_reply=True)
    return out


def _retrieved(
    retrievals: pl.DataFrame, circuit: str, table: pl.DataFrame, id_col: str, cols: list[str]
) -> tuple[pl.DataFrame, int]:
    """(the retrievals of one circuit joined to their rows' `cols`, the number retrieved)."""
    hits = retrievals.filter(pl.col("circuit") == circuit)
    joined = hits.join(
        table.select(id_col, *cols), left_on="item_id", right_on=id_col, how="inner"
    )
    return joined, hits.height


def _per_question(joined: pl.DataFrame, cols: list[str], make: Callable[..., Any]
                  ) -> dict[str, list[Any]]:
    """Rows grouped by question, in the frame's order: make(*row[cols]) each."""
    out: dict[str, list[Any]] = {}
    for qid, *values in joined.select("question_id", *cols).iter_rows():
        out.setdefault(qid, []).append(make(*values))
    return out


def _entry(make: Callable[..., Any]) -> Callable[..., Any]:
    return lambda speaker, t, text: make(speaker=speaker, time=t, text=text)


ENTRY_COLS = ["speaker", "event_time", "text"]


def ranked_entries(
    retrievals: pl.DataFrame, entries: pl.DataFrame, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    """Retrieved entries per question in RANK order (the reference reader's order)."""
    joined, _ = _retrieved(retrievals, "entries", entries, "entry_id", ENTRY_COLS)
    joined = joined.sort(["question_id", "rank"], nulls_last=True)
    return _per_question(joined, ENTRY_COLS, _entry(make))


def synthesis_texts(
    retrievals: pl.DataFrame, syntheses: pl.DataFrame | None
) -> dict[str, list[str]]:
    """Retrieved synthesis texts per question, in rank order, without time ranges."""
    if syntheses is None:
        return {}
    joined, _ = _retrieved(retrievals, "syntheses", syntheses, "synth_id", ["text"])
    joined = joined.sort(["question_id", "rank"], nulls_last=True)
    return _per_question(joined, ["text"], lambda text: text)


def entry_lines(
    retrievals: pl.DataFrame, entries: pl.DataFrame, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    # Chronological order (not rank order): the reader resolves relative dates and "most
    # recent wins" more easily when memories read as a timeline.
    joined, n_hits = _retrieved(retrievals, "entries", entries, "entry_id",
                                [*ENTRY_COLS, "session_index", "turn_index"])
    if joined.height < n_hits:
        log.warning(
            "answer: %d retrieved entry ids are not in entries.parquet", n_hits - joined.height
        )
    joined = joined.sort(
        ["question_id", "event_time", "session_index", "turn_index", "rank"], nulls_last=True
    )
    # Identical (speaker, date, text) lines say nothing new: the two perspectives sometimes
    # word a statement the same way; show it once.
    joined = joined.unique(
        subset=["question_id", *ENTRY_COLS], keep="first", maintain_order=True
    )
    return _per_question(joined, ENTRY_COLS, _entry(make))


def _synthesis_lines(
    retrievals: pl.DataFrame, syntheses: pl.DataFrame | None, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    if syntheses is None:
        return {}
    cols = ["window_start", "window_end", "text"]
    joined, _ = _retrieved(retrievals, "syntheses", syntheses, "synth_id", cols)
    joined = joined.sort(["question_id", "window_start", "rank"], nulls_last=True)
    return _per_question(joined, cols, lambda a, b, text: make(start=a, end=b, text=text))
