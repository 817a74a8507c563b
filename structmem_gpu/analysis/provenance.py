"""Where an answer and a memory came from: per-question and per-conversation provenance views.

Part of the notebook-side analysis (structmem_gpu.analysis): run.py loads runs and the
answers table; this module follows one question or one conversation back to the items,
events and LLM requests behind it. inspect.py re-exports every public name here, so
`from structmem_gpu.analysis.inspect import question_view, memory_of, request_events` keeps
working. It imports run.py only (never inspect.py), so there is no import cycle.

    view = question_view(run, "sample-1:q1")
    view.retrieved                        # ranked items: text, events, dates, evidence hit
    item_catalogue(run, "sample-1")       # every retrievable item with its events and dates
    request_events(run)                   # (request_id, event_id): turns each request covered
    memory_of(run, "sample-1").entries_by_event
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl
import polars.selectors as cs

from structmem_gpu.analysis.run import Run, answers_table
from structmem_gpu.core.errors import InputError
from structmem_gpu.eval import curves


# ---- memory items ---------------------------------------------------------------------------
# Columns of a catalogue item (entry, synthesis, fact, turn ...), empty or not.
ITEM_SCHEMA: dict[str, pl.DataType] = {
    "item_id": pl.String,
    "kind": pl.String,
    "text": pl.String,
    "events": pl.List(pl.String),
    "time_start": pl.Datetime("us"),
    "time_end": pl.Datetime("us"),
}


def _one_event_items(
    df: pl.DataFrame, id_col: str, kind: str, label_col: str, time_col: str
) -> pl.DataFrame:
    """item_catalogue rows of a table whose items each cover one event (entries, turns)."""
    return df.select(
        pl.col(id_col).alias("item_id"),
        pl.lit(kind).alias("kind"),
        (pl.col(label_col) + ": " + pl.col("text")).alias("text"),
        pl.concat_list("event_id").alias("events"),
        pl.col(time_col).alias("time_start"),
        pl.col(time_col).alias("time_end"),
    )


def item_catalogue(run: Run, conv_id: str | None = None) -> pl.DataFrame:
    """Every retrievable item of the run (or one conversation) with its text, events and dates.

    Columns: item_id, kind ("entry" | "synthesis" | "turn"), text, events (list of event_ids),
    time_start, time_end. A synthesis's events are its buffer and context entries' events (what
    evidence recall counts as covered, eval/recall.py).
    """

    def conv(df: pl.DataFrame) -> pl.DataFrame:
        return df if conv_id is None else df.filter(pl.col("conv_id") == conv_id)

    parts: list[pl.DataFrame] = []
    entries = run.optional("entries")
    if entries is not None:
        parts.append(_one_event_items(conv(entries), "entry_id", "entry", "kind", "event_time"))
    syntheses = run.optional("syntheses")
    if syntheses is not None and entries is not None:
        events = conv(entries).select(pl.col("entry_id").alias("eid"), "event_id")
        linked = (
            conv(syntheses)
            .select(
                "synth_id", pl.concat_list("buffer_entry_ids", "context_entry_ids").alias("eid")
            )
            .explode("eid")
            .join(events, on="eid", how="inner")
            .group_by("synth_id")
            .agg(pl.col("event_id").unique().sort().alias("events"))
        )
        parts.append(
            conv(syntheses)
            .join(linked, on="synth_id", how="left")
            .select(
                pl.col("synth_id").alias("item_id"),
                pl.lit("synthesis").alias("kind"),
                "text",
                pl.col("events").fill_null([]),
                pl.col("window_start").alias("time_start"),
                pl.col("window_end").alias("time_end"),
            )
        )
    turns = run.optional("turns")
    if turns is not None:
        parts.append(_one_event_items(conv(turns), "event_id", "turn", "speaker", "session_time"))
    if not parts:
        return pl.DataFrame(
            schema=ITEM_SCHEMA
        )
    return pl.concat(parts, how="vertical_relaxed").unique(
        "item_id", keep="first", maintain_order=True
    )


def evidence_events(conv_id: str, evidence: Iterable[str] | None) -> list[str]:
    """`<conv_id>:<dia_id>` per evidence dia_id (the event ids entries and turns carry)."""
    return [f"{conv_id}:{d}" for d in (evidence or []) if d]


@dataclass(frozen=True)
class QuestionView:
    """Everything about one question: its answer row, retrieved items and evidence turns."""

    row: dict[str, Any]  # the question's answers_table row
    retrieved: pl.DataFrame  # circuit, rank, score, item_id, kind, text, events, dates, hit
    evidence: pl.DataFrame  # the evidence turns: dia_id, session_time, speaker, text, covered

    def summary(self) -> str:
        r = self.row
        hits = int(self.retrieved["covers_evidence"].sum()) if self.retrieved.height else 0
        return (
            f"{r['question_id']} [{r['category_name']}] {r['question']}\n"
            f"  gold: {r['answer']}\n  ours: {r['prediction']}\n"
            f"  judge ({r['judge_name']}): {r['label']} -> {r['failure']}\n"
            f"  evidence turns covered: {int(self.evidence['covered'].sum())}"
            f"/{self.evidence.height}; retrieved items touching evidence: {hits}"
            f"/{self.retrieved.height}"
        )


def question_view(run: Run, question_id: str, judge: str | None = None) -> QuestionView:

    table = answers_table(run, judge).filter(pl.col("question_id") == question_id)
    if table.height == 0:
        raise InputError(run.dir.table_path("answers"), "no answer for this question", question_id)
    row = table.row(0, named=True)
    wanted = set(evidence_events(row["conv_id"], row["evidence"]))
    retrieved = _retrieved(run, question_id, row["conv_id"], wanted)
    covered: set[str] = set()
    for events in retrieved["events"].to_list():
        covered |= set(events or [])
    turns = run.turns.filter(pl.col("event_id").is_in(sorted(wanted)))
    evidence = (
        turns.select("dia_id", "event_id", "session_time", "speaker", "text")
        .with_columns(pl.col("event_id").is_in(sorted(covered)).alias("covered"))
        .sort("event_id")
    )
    return QuestionView(row=row, retrieved=retrieved, evidence=evidence)


def _retrieved(run: Run, question_id: str, conv_id: str, wanted: set[str]) -> pl.DataFrame:
    if not run.has("retrievals"):
        # full_context answers from the whole conversation: nothing was retrieved.
        return pl.DataFrame(
            schema={"circuit": pl.String, "rank": pl.Int32, "score": pl.Float64, **ITEM_SCHEMA,
                    "covers_evidence": pl.Boolean}
        )
    rows = run.retrievals.filter(pl.col("question_id") == question_id)
    # Methods whose items live in their own tables (SEEM facts/frames, graph relations) write
    # the item's text and events into retrievals.parquet itself: used where the catalogue has none.
    own = {"text": ["text", "relation_text"], "events": ["event_ids"]}
    given = {col: [c for c in cols if c in rows.columns] for col, cols in own.items()}
    out = rows.select(
        "circuit",
        "rank",
        "score",
        "item_id",
        *[pl.col(c).alias(f"_own_{c}") for cols in given.values() for c in cols],
    ).join(item_catalogue(run, conv_id), on="item_id", how="left")
    for col, cols in given.items():
        if cols:
            out = out.with_columns(pl.coalesce(col, *[f"_own_{c}" for c in cols]))
    out = out.drop(cs.starts_with("_own_"))
    hit = pl.col("events").fill_null([]).list.eval(pl.element().is_in(sorted(wanted))).list.any()
    return out.with_columns(hit.fill_null(False).alias("covers_evidence")).sort("circuit", "rank")


# ---- which turns each LLM request covered --------------------------------------------------
def request_events(run: Run) -> pl.DataFrame:
    """(request_id, event_id) pairs: the turns each memory-building request covered
    (eval/curves.py's request_events, which the report's figures use too)."""
    return curves.request_events(run.dir)


# ---- one conversation's memory --------------------------------------------------------------
@dataclass(frozen=True)
class Memory:
    """One conversation: its turns, entries (flat and grouped by event) and syntheses."""

    conv_id: str
    turns: pl.DataFrame
    entries: pl.DataFrame
    entries_by_event: pl.DataFrame  # one row per event: the turn and its facts / relations
    syntheses: pl.DataFrame  # with buffer / seed / context dia_ids


def memory_of(run: Run, conv_id: str) -> Memory:
    turns = run.turns.filter(pl.col("conv_id") == conv_id).sort("session_index", "turn_index")
    if turns.height == 0:
        raise InputError(run.dir.table_path("turns"), "no turns for this conversation", conv_id)
    entries = run.optional("entries")
    entries = (
        entries.filter(pl.col("conv_id") == conv_id).sort("event_time", "turn_index")
        if entries is not None
        else pl.DataFrame(schema=_ENTRY_COLS)
    )
    by_kind = [
        pl.col("text").filter(pl.col("kind") == k).alias(f"{k}s") for k in ("fact", "relation")
    ]
    by_event = (
        entries.group_by("event_id", maintain_order=True)
        .agg(*by_kind)
        .join(
            turns.select(
                "event_id", "dia_id", "session_time", "speaker", pl.col("text").alias("turn_text")
            ),
            on="event_id",
            how="left",
        )
        .select("dia_id", "session_time", "speaker", "turn_text", "facts", "relations", "event_id")
    )
    return Memory(
        conv_id=conv_id,
        turns=turns.select(
            "session_index",
            "session_time",
            "dia_id",
            "speaker",
            "text",
            "image_caption",
            "event_id",
        ),
        entries=entries,
        entries_by_event=by_event,
        syntheses=_syntheses_of(run, conv_id),
    )


_ENTRY_COLS = {
    "entry_id": pl.String,
    "event_id": pl.String,
    "dia_id": pl.String,
    "event_time": pl.Datetime("us"),
    "turn_index": pl.Int32,
    "speaker": pl.String,
    "kind": pl.String,
    "text": pl.String,
}


_SYNTH_COLS = {
    "window_index": pl.Int32,
    "window_start": pl.Datetime("us"),
    "window_end": pl.Datetime("us"),
    "text": pl.String,
    "buffer_events": pl.List(pl.String),
    "seed_events": pl.List(pl.String),
    "context_events": pl.List(pl.String),
    "synth_id": pl.String,
}


def _syntheses_of(run: Run, conv_id: str) -> pl.DataFrame:
    syn, ent = run.optional("syntheses"), run.optional("entries")
    if syn is None or ent is None:  # a method without consolidation: same columns, no rows
        return pl.DataFrame(schema=_SYNTH_COLS)
    dia = dict(ent.filter(pl.col("conv_id") == conv_id).select("entry_id", "dia_id").iter_rows())

    def dia_ids(col: str) -> pl.Expr:
        # Entry ids -> the dia_ids of their events, deduplicated in order: what a reader looks up.
        return (
            pl.col(col)
            .map_elements(
                lambda ids: list(dict.fromkeys(dia[i] for i in ids if i in dia)),
                return_dtype=pl.List(pl.String),
            )
            .alias(col.replace("_entry_ids", "_events"))
        )

    return (
        syn.filter(pl.col("conv_id") == conv_id)
        .sort("window_index")
        .with_columns(
            dia_ids("buffer_entry_ids"), dia_ids("seed_entry_ids"), dia_ids("context_entry_ids")
        )
        .select(
            "window_index",
            "window_start",
            "window_end",
            "text",
            "buffer_events",
            "seed_events",
            "context_events",
            "synth_id",
        )
    )
