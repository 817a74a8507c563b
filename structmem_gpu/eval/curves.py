"""The data behind the figures of eval/plots.py, as polars frames (no matplotlib import).

Kept apart from plots.py so that a notebook, a test or a job can compute the curves (and check
them) without loading matplotlib: plots.py draws them and re-exports the public names here, so
`plots.recall_at_k`, `plots.NothingToPlot` etc. keep working.

    category_accuracy(judged)                               # accuracy_by_category.png
    build_cost_frame(run.manifest)                          # build_cost.png
    cumulative_build_tokens(requests, turns, request_events(run_dir))  # paper Fig. 3a
    recall_at_k(run.questions, run.retrievals, entries, syntheses)  # evidence_recall_at_k.png

Each function raises NothingToPlot (a ValueError and a StructMemError) on an empty input.
Also here: which published rows are drawn beside ours (`_distinct_published`,
`_published_sweep`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval.bootstrap import bootstrap_ci
from structmem_gpu.eval.published import PublishedRow, load_published
from structmem_gpu.eval.recall import TURN_CIRCUITS, EvidenceIndex
from structmem_gpu.stage_lookup import RunStages
from structmem_gpu.core.stage_parts import BUILD

log = logging.getLogger(__name__)



class NothingToPlot(StructMemError, ValueError):
    """A figure's input table is empty; the message names the table."""


# ---- accuracy by category -------------------------------------------------------------------
def category_accuracy(
    judged: pl.DataFrame, *, resamples: int = 1000, seed: int = 0
) -> pl.DataFrame:
    """category, category_name, n, accuracy, ci_low, ci_high (+ an "overall" row, category -1)
    from judged rows (question_id, category, category_name, label; null labels ignored)."""
    rows = judged.filter(pl.col("label").is_not_null())
    if rows.height == 0:
        raise NothingToPlot("no judged questions in judgments.parquet: nothing to plot")
    out = []
    groups = [
        (c, n, rows.filter(pl.col("category") == c))
        for c, n in rows.select("category", "category_name").unique().sort("category").iter_rows()
    ]
    for cat, name, df in groups + [(-1, "overall", rows)]:
        labels = df["label"].cast(pl.Float64).to_list()
        lo, hi = bootstrap_ci(labels, resamples=resamples, seed=seed) or (None, None)
        out.append(
            {
                "category": cat,
                "category_name": name or str(cat),
                "n": len(labels),
                "accuracy": float(np.mean(labels)),
                "ci_low": lo,
                "ci_high": hi,
            }
        )
    return pl.DataFrame(out)


def _distinct_published(published: Sequence[PublishedRow]) -> list[PublishedRow]:
    """Rows with judge accuracy; an overall-only row repeating a kept row's overall (the paper's
    K = 15 point is its Table 1 headline) would only draw the same bar twice."""
    rows = [
        p for p in published if p.by_category.get("judge_accuracy") or "judge_accuracy" in p.overall
    ]
    rows.sort(key=lambda p: not p.by_category.get("judge_accuracy"))  # per-category rows first
    kept: list[PublishedRow] = []
    for p in rows:
        if not p.by_category.get("judge_accuracy") and any(
            k.overall.get("judge_accuracy") == p.overall.get("judge_accuracy") for k in kept
        ):
            continue
        kept.append(p)
    return kept


# ---- build cost per stage -------------------------------------------------------------------
def build_cost_frame(manifest: Mapping[str, Any], order: Sequence[str] = ()) -> pl.DataFrame:
    """stage, calls, cache_hits, prompt_tokens, completion_tokens, wall_s from manifest.json."""
    stages = manifest.get("stages") or {}
    # Manifest keys are sorted alphabetically and start times tie at one-second resolution:
    # the given order (the method's `stages`) first, then anything else by start time.
    known = list(dict.fromkeys(order))
    rest = sorted(
        (s for s in stages if s not in known),
        key=lambda s: (str(stages[s].get("started") or ""), s),
    )
    names = [s for s in known if s in stages] + rest
    rows = [
        {
            "stage": s,
            **{
                k: (stages[s].get("build_cost") or {}).get(k) or 0
                for k in ("calls", "cache_hits", "prompt_tokens", "completion_tokens")
            },
            "wall_s": float((stages[s].get("build_cost") or {}).get("wall_s") or 0.0),
        }
        for s in names
        if stages[s].get("build_cost")
    ]
    if not rows:
        raise NothingToPlot("no stage with a build_cost in manifest.json: nothing to plot")
    return pl.DataFrame(rows)


# ---- cumulative build tokens over dialogue turns (paper Fig. 3a) ----------------------------
# What the curves read of each big table (RunDir.read_table(columns=...)): a LongMemEval-M
# run's turns expand to millions of rows and its entries carry every text, never needed here.
TURN_POSITION_COLUMNS = ("event_id", "conv_id", "session_index", "turn_index")
CUMULATIVE_REQUEST_COLUMNS = ("request_id", "stage", "conv_id", "prompt_tokens",
                              "completion_tokens")
EVIDENCE_ENTRY_COLUMNS = ("entry_id", "event_id")
EVIDENCE_SYNTHESIS_COLUMNS = ("synth_id", "request_id", "buffer_entry_ids", "context_entry_ids")


def turn_positions(turns: pl.DataFrame) -> pl.DataFrame:
    """event_id -> conv_id, turn (1-based position in its conversation, chronological)."""
    return (
        turns.sort("conv_id", "session_index", "turn_index")
        .with_columns(pl.int_range(1, pl.len() + 1).over("conv_id").alias("turn"))
        .select("event_id", "conv_id", "turn")
    )


# ---- which turns each LLM request covered --------------------------------------------------
# Columns naming the event(s) a row comes from (entries, graph_memory's graph tables, SEEM's
# frames and facts: SEEM passage ids are event ids).
_EVENT_COLS = ("event_id", "event_ids", "pid", "provenance")
_LINK_SCHEMA = {"request_id": pl.String, "event_id": pl.String}


def request_events(run: RunDir) -> pl.DataFrame:
    """(request_id, event_id) pairs: the turns each memory-building request covered.

    Read from every table whose rows record a request and events: entries (request_id ->
    event_id), graph / SEEM tables, and syntheses (request_id -> buffer entries' events). Rows
    that merge several requests (request_ids of length > 1) are skipped: which request saw
    which event is lost there.
    """
    parts = [pl.DataFrame(schema=_LINK_SCHEMA)]
    for name in sorted(p.stem for p in run.tables_dir.glob("*.parquet")):
        schema = _scan(run, name).collect_schema()
        parts.extend(_history_links(run, name, schema))
        req = next((c for c in ("request_id", "request_ids") if c in schema), None)
        ev = next((c for c in _EVENT_COLS if c in schema), None)
        if req is None or ev is None:
            continue
        lf = _scan(run, name).select(pl.col(req).alias("request_id"), pl.col(ev).alias("event_id"))
        if isinstance(schema[req], pl.List):
            lf = lf.filter(pl.col("request_id").list.len() == 1).with_columns(
                pl.col("request_id").list.first()
            )
        if isinstance(schema[ev], pl.List):
            lf = lf.explode("event_id")
        parts.append(lf.collect().cast(_LINK_SCHEMA))  # type: ignore[arg-type]
    if run.has_table("syntheses") and run.has_table("entries"):
        syn = run.read_table("syntheses", columns=EVIDENCE_SYNTHESIS_COLUMNS)
        ent = run.read_table("entries", columns=EVIDENCE_ENTRY_COLUMNS)
        parts.append(
            syn.select("request_id", pl.col("buffer_entry_ids").alias("entry_id"))
            .explode("entry_id")
            .join(ent.select("entry_id", "event_id"), on="entry_id")
            .select("request_id", "event_id")
        )
    return pl.concat(parts).drop_nulls().unique(maintain_order=True)


def _history_links(run: RunDir, name: str, schema: pl.Schema) -> list[pl.DataFrame]:
    """Links from a `history` list of steps that each name a request and its passages (SEEM's
    frame fusion: one request per step, judging the step's `pids` against the frame)."""
    hist = schema.get("history")
    if not (isinstance(hist, pl.List) and isinstance(hist.inner, pl.Struct)):
        return []
    fields = {f.name for f in hist.inner.fields}
    if not {"request_id", "pids"} <= fields:
        return []
    steps = (
        _scan(run, name)
        .select(pl.col("history").explode().struct.field("request_id", "pids"))
        .explode("pids")
        .select("request_id", pl.col("pids").alias("event_id"))
    )
    return [steps.collect().cast(_LINK_SCHEMA)]  # type: ignore[arg-type]


def _scan(run: RunDir, name: str) -> pl.LazyFrame:
    return pl.scan_parquet(run.table_path(name), glob=False)


def cumulative_build_tokens(
    requests: pl.DataFrame, turns: pl.DataFrame, links: pl.DataFrame | None = None,
    stages: "RunStages | None" = None,
) -> pl.DataFrame:
    """Build tokens spent by the time the dialogue reaches turn t, as an online agent would.

    Every memory-building request (a stage whose part is "build" as the run's method declared
    it: `stages`, stage_lookup.RunStages; None = the packaged methods'; audits, input and
    per-question stages excluded) is charged,
    prompt + completion tokens (cache hits keep their counts), at the LAST turn it covers: the
    moment it could first be sent. `links` (request_id, event_id) says which turns a request
    covered (request_events: an extraction request covers the events of the entries
    it wrote, a synthesis request its buffer entries' events). Requests without links (no
    entries written, SEEM's fusion steps) are charged at their conversation's last turn (all
    conversations' when conv_id is null) and counted in the log. Turn t is the t-th turn of a
    conversation; conversations are summed at equal t. Returns turn, stage, tokens,
    cumulative_tokens (one row per turn and stage).
    """
    parts = stages if stages is not None else RunStages()
    names = requests["stage"].unique().to_list() if requests.height else []
    build = requests.filter(pl.col("stage").is_in(sorted(n for n in names if parts.part(n) == BUILD)))
    if build.height == 0:
        raise NothingToPlot("no memory-building requests in requests.parquet: nothing to plot")
    pos = turn_positions(turns)
    if links is None:
        links = pl.DataFrame(schema={"request_id": pl.String, "event_id": pl.String})
    charged = (
        links.select("request_id", "event_id")
        .join(pos, on="event_id")
        .group_by("request_id")
        .agg(pl.col("turn").max())
    )
    last = pos.group_by("conv_id").agg(pl.col("turn").max().alias("last"))
    df = (
        build.join(charged, on="request_id", how="left")
        .join(last, on="conv_id", how="left")
        .with_columns(
            pl.col("turn").is_null().alias("unmapped"),
            pl.coalesce("turn", "last", pl.lit(int(pos["turn"].max() or 1))).alias("turn"),
            (pl.col("prompt_tokens").fill_null(0) + pl.col("completion_tokens").fill_null(0)).alias(
                "tokens"
            ),
        )
    )
    if int(df["unmapped"].sum()):
        log.info(
            "cumulative build tokens: %d of %d requests without turn provenance charged at "
            "their conversation's last turn",
            int(df["unmapped"].sum()),
            df.height,
        )
    per = df.group_by("stage", "turn").agg(pl.col("tokens").sum())
    # The x axis runs to the longest conversation's last turn, charged or not.
    n_turns = max(int(pos["turn"].max() or 1), int(df["turn"].max()))
    grid = pl.DataFrame({"turn": np.arange(1, n_turns + 1)}).join(
        per.select("stage").unique(), how="cross"
    )
    return (
        grid.join(per, on=["stage", "turn"], how="left")
        .with_columns(pl.col("tokens").fill_null(0))
        .sort("stage", "turn")
        .with_columns(pl.col("tokens").cum_sum().over("stage").alias("cumulative_tokens"))
    )


# ---- evidence recall@k ----------------------------------------------------------------------
def _retrieved_only(retrievals: pl.DataFrame, entries: pl.DataFrame | None,
                    syntheses: pl.DataFrame | None
                    ) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The entries and syntheses a retrieval names (a synthesis with the entries it covers):
    the index is the same for every retrieved item, and stays the size of the retrievals, not
    of the memory (millions of entries on LongMemEval-M)."""
    items = retrievals.select(pl.col("item_id").unique())["item_id"]
    if syntheses is not None:
        syntheses = syntheses.filter(pl.col("synth_id").is_in(items.implode()))
        covered = pl.concat([syntheses["buffer_entry_ids"].explode(),
                             syntheses["context_entry_ids"].explode(), items]).drop_nulls()
        items = covered.unique()
    if entries is not None:
        entries = entries.filter(pl.col("entry_id").is_in(items.implode()))
    return entries, syntheses


def recall_at_k(
    questions: pl.DataFrame,
    retrievals: pl.DataFrame,
    entries: pl.DataFrame | None = None,
    syntheses: pl.DataFrame | None = None,
    max_k: int | None = None,
) -> pl.DataFrame:
    """Mean evidence recall of the top-k items of each circuit, k = 1..max_k (default: the
    circuit's depth). Same coverage rule as eval/recall.py (plus the `event_ids` methods with
    their own item tables write into retrievals.parquet); questions without resolvable evidence
    are left out. Columns: circuit, category_name ("all" = every category), k,
    recall, n (questions)."""
    asked = questions.filter(
        pl.col("question_id").is_in(retrievals["question_id"].unique().to_list())
    )
    ev = {
        q: {f"{c}:{d}" for d in (e or []) if d}
        for q, c, e in asked.select("question_id", "conv_id", "evidence").iter_rows()
    }
    ev = {q: e for q, e in ev.items() if e}
    if retrievals.height == 0 or not ev:
        raise NothingToPlot(
            "no retrieved question with resolvable evidence in retrievals.parquet: nothing to plot"
        )
    index = EvidenceIndex.build(*_retrieved_only(retrievals, entries, syntheses))
    cats = dict(asked.select("question_id", "category_name").iter_rows())
    # Category lines in category-id order, after "all".
    cat_order = ["all"] + asked.sort("category")["category_name"].unique(
        maintain_order=True
    ).to_list()
    rows: list[dict[str, Any]] = []
    for (circuit,), df in retrievals.group_by(["circuit"], maintain_order=True):
        first = _first_hits(df, circuit, ev, index)
        if first is None:
            log.info("recall@k: circuit %r has no items that map to events; left out", circuit)
            continue
        depth = max_k or int(df["rank"].max()) + 1
        ks = np.arange(1, depth + 1)
        by_cat: dict[str, list[np.ndarray]] = {}
        for qid, ranks in first.items():
            curve = (np.asarray(ranks)[:, None] < ks[None, :]).mean(axis=0)
            by_cat.setdefault("all", []).append(curve)
            by_cat.setdefault(str(cats.get(qid)), []).append(curve)
        for name, curves_ in sorted(
            by_cat.items(),
            key=lambda kv: cat_order.index(kv[0]) if kv[0] in cat_order else len(cat_order),
        ):
            mean = np.mean(curves_, axis=0)
            rows += [
                {
                    "circuit": circuit,
                    "category_name": name,
                    "k": int(k),
                    "recall": float(v),
                    "n": len(curves_),
                }
                for k, v in zip(ks, mean)
            ]
    if not rows:
        raise NothingToPlot(
            "no retrieval circuit whose items map to turns in retrievals.parquet: nothing to plot"
        )
    return pl.DataFrame(rows)


def _first_hits(
    df: pl.DataFrame, circuit: str, ev: Mapping[str, set[str]], index: EvidenceIndex
) -> dict[str, list[float]] | None:
    """question -> the rank at which each evidence event is first covered (inf: never), for one
    circuit's rows; None when none of the circuit's items maps to events.

    An item covers: itself for turn circuits; its entry/synthesis events (eval/recall.py);
    else the `event_ids` the method wrote into retrievals.parquet (SEEM, graph_memory)."""
    own = "event_ids" in df.columns
    cols = [pl.col("item_id"), pl.col("event_ids") if own else pl.lit(None).alias("event_ids")]
    per_q = df.sort("rank").group_by("question_id").agg(pl.col("rank"), *cols)
    first: dict[str, list[float]] = {}
    resolved = False
    for qid, ranks, items, owned in per_q.iter_rows():
        if qid not in ev:
            continue
        hit: dict[str, int] = {}
        for r, item, events in zip(ranks, items, owned or [None] * len(items)):
            if circuit in TURN_CIRCUITS:
                covered: Iterable[str] = (item,)
            else:
                covered = index.item_events.get(item) or events or ()
            resolved = resolved or bool(covered)
            for e in ev[qid].intersection(covered):
                hit.setdefault(e, r)
        first[qid] = [hit.get(e, np.inf) for e in ev[qid]]
    return first if resolved else None


# ---- sweeps (paper Fig. 3c / 3d) ------------------------------------------------------------
def _published_sweep(df: pl.DataFrame, key: str) -> list[PublishedRow]:
    """Published rows that vary `key` for a benchmark/method pair the sweep ran."""
    pairs = set(df.select("benchmark", "method").unique().iter_rows())
    return [
        p
        for p in load_published()
        if p.match and key in p.match and (p.match.get("benchmark"), p.match.get("method")) in pairs
    ]
