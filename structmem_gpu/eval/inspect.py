"""Read a finished run (or a sweep of runs) as polars frames, joined for reading by a person.

Used by the notebooks (notebooks/*.ipynb) and by anyone poking at a run directory; it only
reads the run directory contract (DESIGN.md) and never runs pipeline logic.

    from structmem_gpu.eval.inspect import answers_table, load_run, memory_of, question_view
    run = load_run("outputs/runs/sample/structmem")
    run.judgments                         # read on first access, then cached
    wrong = answers_table(run).filter(pl.col("failure") == "evidence_missed")
    view = question_view(run, "sample-1:q1")
    view.retrieved                        # ranked items: text, events, dates, evidence hit
    memory_of(run, "sample-1").entries_by_event
    load_sweep("outputs/multirun/sample/2026-05-01_12-00-00").comparison()

One row of `answers_table(run)`:

    {"question_id": "sample-1:q1", "category": 2, "category_name": "temporal",
     "question": "When did Tomas bring Biscuit home?", "answer": "16 March 2024",
     "prediction": "Not mentioned in the conversation", "label": False,
     "judge_name": "same_as_llm", "evidence": ["D2:1"], "evidence_recall": 0.0,
     "failure": "evidence_missed", ...}
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
import polars.selectors as cs

from structmem_gpu.artifacts import MANIFEST, RunDir
from structmem_gpu.errors import InputError
from structmem_gpu.eval.published import PublishedRow, load_published

log = logging.getLogger(__name__)

# What went wrong with one answer (column `failure` of answers_table), in the order a reader
# would check: no verdict, no answer, then how much of the evidence the memory handed over.
FAILURE_TYPES: dict[str, str] = {
    "correct": "the judge labelled the answer CORRECT",
    "unjudged": "the judge's reply had no readable label (not counted as wrong)",
    "no_answer": "the answer request failed or returned an empty reply",
    "evidence_missed": "wrong; retrieval covered none of the evidence turns",
    "evidence_partial": "wrong; retrieval covered some but not all evidence turns",
    "evidence_retrieved": "wrong although retrieval covered every evidence turn (answering failed)",
    "no_evidence": "wrong; the question has no resolvable evidence or the run no retrievals",
}
# Config keys a sweep usually varies (paper Fig. 3c/3d); load_sweep adds them as columns.
SWEEP_KEYS = ("consolidate.seed_k", "retrieve.entries_k", "retrieve.syntheses_k")
_ALIASES = {
    "method": "method",
    "benchmark": "benchmark",
    "method.name": "method",
    "benchmark.name": "benchmark",
}


class Run:
    """One run directory; tables are read lazily and cached (`run.entries`, `run.table(...)`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.dir = RunDir(self.root)
        self._tables: dict[str, pl.DataFrame] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.root)!r}, method={self.method!r}, benchmark={self.benchmark!r})"

    # ---- tables ---------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return self.dir.has_table(name)

    def available(self) -> list[str]:
        return sorted(p.stem for p in self.dir.tables_dir.glob("*.parquet"))

    def table(self, name: str) -> pl.DataFrame:
        """The table, read once (MissingTableError naming the file when it does not exist)."""
        if name not in self._tables:
            self._tables[name] = self.dir.read_table(name)
        return self._tables[name]

    def optional(self, name: str) -> pl.DataFrame | None:
        return self.table(name) if self.has(name) else None

    def scan(self, name: str) -> pl.LazyFrame:
        """A lazy frame, for tables too large to read whole (glob=False: see RunDir)."""
        if not self.has(name):
            self.dir.read_table(name)  # raises the contract's MissingTableError message
        return pl.scan_parquet(self.dir.table_path(name), glob=False)

    @property
    def turns(self) -> pl.DataFrame:
        return self.table("turns")

    @property
    def questions(self) -> pl.DataFrame:
        return self.table("questions")

    @property
    def entries(self) -> pl.DataFrame:
        return self.table("entries")

    @property
    def syntheses(self) -> pl.DataFrame:
        return self.table("syntheses")

    @property
    def requests(self) -> pl.DataFrame:
        return self.table("requests")

    @property
    def retrievals(self) -> pl.DataFrame:
        return self.table("retrievals")

    @property
    def answers(self) -> pl.DataFrame:
        return self.table("answers")

    @property
    def judgments(self) -> pl.DataFrame:
        return self.table("judgments")

    # ---- manifest, report, config ---------------------------------------------------------
    @cached_property
    def manifest(self) -> dict[str, Any]:
        return self.dir.load_manifest()

    @cached_property
    def report(self) -> dict[str, Any] | None:
        path = self.dir.report_dir / "report.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    @property
    def method(self) -> str | None:
        return self.manifest.get("method")

    @property
    def benchmark(self) -> str | None:
        return self.manifest.get("benchmark")

    @property
    def figures(self) -> list[Path]:
        return sorted(self.dir.report_dir.glob("*.png"))

    def config_value(self, key: str) -> Any:
        """A dotted config value as the stages recorded it in the manifest (else .hydra/config.yaml).

        None when no finished stage read the key (e.g. consolidate.seed_k of a flat run).
        """
        if key in _ALIASES:
            return self.manifest.get(_ALIASES[key])
        for entry in (self.manifest.get("stages") or {}).values():
            found, value = _lookup(entry.get("config") or {}, key)
            if found:
                return value
        hydra_cfg = self.root / ".hydra" / "config.yaml"
        if hydra_cfg.is_file():
            from omegaconf import OmegaConf

            return OmegaConf.select(OmegaConf.load(hydra_cfg), key, default=None)
        return None


def _lookup(config: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """Find `a.b.c` in a stage's recorded config, stored flat ("a.b.c") or nested ("a": {...})."""
    parts = key.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head not in config:
            continue
        value: Any = config[head]
        for part in parts[cut:]:
            if not isinstance(value, Mapping) or part not in value:
                break
            value = value[part]
        else:
            return True, value
    return False, None


def _resolve(path: str | Path) -> Path:
    """A relative path missing from the working directory is tried from its parent: Jupyter
    starts a notebook's kernel in notebooks/, while run paths are written from the repo root."""
    root = Path(path)
    if not root.is_absolute() and not root.exists() and (Path.cwd().parent / root).exists():
        return Path.cwd().parent / root
    return root


def load_run(run_dir: str | Path) -> Run:
    root = _resolve(run_dir)
    if not (root / MANIFEST).is_file() and not (root / "tables").is_dir():
        raise InputError(root, "not a run directory (no manifest.json and no tables/)")
    return Run(root)


def load(path: str | Path) -> Run | Sweep:
    """A run directory as a Run; any other folder as the Sweep of the runs below it."""
    root = _resolve(path)
    if (root / MANIFEST).is_file():
        return Run(root)
    return load_sweep(root)


def published_rows(run: Run) -> list[PublishedRow]:
    """Published figures whose `match` block equals this run's recorded configuration
    (eval/published.py's matching_rows, from the manifest instead of a Hydra config)."""
    rows = load_published()
    facts = {k: run.config_value(k) for r in rows if r.match for k in r.match}
    return [r for r in rows if r.match and all(facts[k] == v for k, v in r.match.items())]


def scores_table(run: Run) -> pl.DataFrame:
    """report.json's scores as a frame: one row per category, then "overall" (fractions)."""
    if run.report is None:
        raise InputError(run.dir.report_dir / "report.json", "missing; run stages=[report] first")
    metrics = ("n", "judge_accuracy", "f1_locomo", "f1_mem0", "bleu1", "evidence_recall")
    groups = [(c, g) for c, g in run.report["by_category"].items()]
    groups += [("overall", run.report["overall"])]
    return pl.DataFrame(
        [
            {
                "category": c,
                "name": g.get("name"),
                **{m: g.get(m) for m in metrics},
                "ci95": g.get("judge_accuracy_ci95"),
            }
            for c, g in groups
        ],
        infer_schema_length=None,
    )


# ---- answers --------------------------------------------------------------------------------
def headline_judge(run: Run) -> str | None:
    """The judge report.json headlines, else the first judge in judgments.parquet."""
    if run.report and run.report.get("judge"):
        return str(run.report["judge"])
    names = run.judgments["judge_name"].drop_nulls().unique(maintain_order=True).to_list()
    return names[0] if names else None


def answers_table(run: Run, judge: str | None = None) -> pl.DataFrame:
    """One row per answered question: question, gold, prediction, judge label/reply, scores,
    evidence recall and a `failure` type (FAILURE_TYPES). `judge` defaults to the headline one."""
    q = run.questions.select(
        "conv_id",
        "question_id",
        "category",
        "category_name",
        "question",
        "answer",
        "evidence",
        "is_abstention",
    )
    a = run.answers.select(
        "question_id",
        "prediction",
        pl.col("request_id").alias("answer_request_id"),
        pl.col("parse_ok").alias("answer_parse_ok"),
    )
    judge = judge or headline_judge(run)
    j = run.judgments.filter(pl.col("judge_name") == judge).select(
        "question_id",
        "judge_name",
        "judge_model",
        "label",
        "reply_raw",
        "f1_locomo",
        "f1_mem0",
        "bleu1",
        "evidence_recall",
    )
    out = a.join(q, on="question_id", how="left").join(j, on="question_id", how="left")
    return out.with_columns(failure_type()).select(
        "conv_id",
        "question_id",
        "category",
        "category_name",
        "question",
        "answer",
        "prediction",
        "label",
        "failure",
        "judge_name",
        "reply_raw",
        "evidence",
        "evidence_recall",
        "f1_locomo",
        "f1_mem0",
        "bleu1",
        "judge_model",
        "answer_request_id",
        "answer_parse_ok",
        "is_abstention",
    )


def failure_type() -> pl.Expr:
    recall = pl.col("evidence_recall")
    empty = pl.col("prediction").fill_null("").str.strip_chars() == ""
    return (
        pl.when(pl.col("label"))
        .then(pl.lit("correct"))
        .when(pl.col("label").is_null())
        .then(pl.lit("unjudged"))
        .when(empty | ~pl.col("answer_parse_ok").fill_null(True))
        .then(pl.lit("no_answer"))
        .when(recall.is_null())
        .then(pl.lit("no_evidence"))
        .when(recall == 0)
        .then(pl.lit("evidence_missed"))
        .when(recall < 1)
        .then(pl.lit("evidence_partial"))
        .otherwise(pl.lit("evidence_retrieved"))
        .alias("failure")
    )


# ---- memory items ---------------------------------------------------------------------------
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
        parts.append(
            conv(entries).select(
                pl.col("entry_id").alias("item_id"),
                pl.lit("entry").alias("kind"),
                (pl.col("kind") + ": " + pl.col("text")).alias("text"),
                pl.concat_list("event_id").alias("events"),
                pl.col("event_time").alias("time_start"),
                pl.col("event_time").alias("time_end"),
            )
        )
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
        parts.append(
            conv(turns).select(
                pl.col("event_id").alias("item_id"),
                pl.lit("turn").alias("kind"),
                (pl.col("speaker") + ": " + pl.col("text")).alias("text"),
                pl.concat_list("event_id").alias("events"),
                pl.col("session_time").alias("time_start"),
                pl.col("session_time").alias("time_end"),
            )
        )
    if not parts:
        return pl.DataFrame(
            schema={
                "item_id": pl.String,
                "kind": pl.String,
                "text": pl.String,
                "events": pl.List(pl.String),
                "time_start": pl.Datetime("us"),
                "time_end": pl.Datetime("us"),
            }
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
            schema={
                "circuit": pl.String,
                "rank": pl.Int32,
                "score": pl.Float64,
                "item_id": pl.String,
                "kind": pl.String,
                "text": pl.String,
                "events": pl.List(pl.String),
                "time_start": pl.Datetime("us"),
                "time_end": pl.Datetime("us"),
                "covers_evidence": pl.Boolean,
            }
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
# Columns naming the event(s) a row comes from (entries, graph_memory's graph tables, SEEM's
# frames and facts: SEEM passage ids are event ids).
_EVENT_COLS = ("event_id", "event_ids", "pid", "provenance")
_LINK_SCHEMA = {"request_id": pl.String, "event_id": pl.String}


def request_events(run: Run) -> pl.DataFrame:
    """(request_id, event_id) pairs: the turns each memory-building request covered.

    Read from every table whose rows record a request and events: entries (request_id ->
    event_id), graph / SEEM tables, and syntheses (request_id -> buffer entries' events). Rows
    that merge several requests (request_ids of length > 1) are skipped: which request saw
    which event is lost there.
    """
    parts = [pl.DataFrame(schema=_LINK_SCHEMA)]
    for name in run.available():
        schema = run.scan(name).collect_schema()
        parts.extend(_history_links(run, name, schema))
        req = next((c for c in ("request_id", "request_ids") if c in schema), None)
        ev = next((c for c in _EVENT_COLS if c in schema), None)
        if req is None or ev is None:
            continue
        lf = run.scan(name).select(pl.col(req).alias("request_id"), pl.col(ev).alias("event_id"))
        if isinstance(schema[req], pl.List):
            lf = lf.filter(pl.col("request_id").list.len() == 1).with_columns(
                pl.col("request_id").list.first()
            )
        if isinstance(schema[ev], pl.List):
            lf = lf.explode("event_id")
        parts.append(lf.collect().cast(_LINK_SCHEMA))  # type: ignore[arg-type]
    syn, ent = run.optional("syntheses"), run.optional("entries")
    if syn is not None and ent is not None:
        parts.append(
            syn.select("request_id", pl.col("buffer_entry_ids").alias("entry_id"))
            .explode("entry_id")
            .join(ent.select("entry_id", "event_id"), on="entry_id")
            .select("request_id", "event_id")
        )
    return pl.concat(parts).drop_nulls().unique(maintain_order=True)


def _history_links(run: Run, name: str, schema: pl.Schema) -> list[pl.DataFrame]:
    """Links from a `history` list of steps that each name a request and its passages (SEEM's
    frame fusion: one request per step, judging the step's `pids` against the frame)."""
    hist = schema.get("history")
    if not (isinstance(hist, pl.List) and isinstance(hist.inner, pl.Struct)):
        return []
    fields = {f.name for f in hist.inner.fields}
    if not {"request_id", "pids"} <= fields:
        return []
    steps = (
        run.scan(name)
        .select(pl.col("history").explode().struct.field("request_id", "pids"))
        .explode("pids")
        .select("request_id", pl.col("pids").alias("event_id"))
    )
    return [steps.collect().cast(_LINK_SCHEMA)]  # type: ignore[arg-type]


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


# ---- sweeps ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """The run directories below a sweep (or merged-sweep) directory, by relative name."""

    root: Path
    runs: dict[str, Run]

    @property
    def finished(self) -> list[Run]:
        """Runs whose report stage finished (report/report.json)."""
        return [r for r in self.runs.values() if r.report is not None]

    def comparison(self, keys: Sequence[str] = SWEEP_KEYS) -> pl.DataFrame:
        """compare_runs' one-row-per-run frame (finished runs only) plus config columns."""
        if not self.finished:
            raise InputError(self.root, "no finished run (report/report.json) below it")
        return sweep_frame([r.root for r in self.finished], keys)


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Every directory at or below `sweep_dir` holding a manifest.json (job subdirs, merged
    runs); shard directories that a merged directory replaces are listed too, by their path."""
    root = _resolve(sweep_dir)
    dirs = sorted({p.parent for p in root.rglob(MANIFEST)})
    if not dirs:
        raise InputError(root, "no run directories (manifest.json) at or below it")
    runs = {(str(d.relative_to(root)) if d != root else "."): Run(d) for d in dirs}
    return Sweep(root=root, runs=runs)


def sweep_frame(run_dirs: Iterable[str | Path], keys: Sequence[str] = SWEEP_KEYS) -> pl.DataFrame:
    """One row per finished run (structmem_gpu.eval.compare) plus a column per config key."""
    from structmem_gpu.eval.compare import compare_runs

    dirs = [Path(d) for d in run_dirs]
    frame = compare_runs(dirs)
    values = {k: [load_run(d).config_value(k) for d in dirs] for k in keys}
    return frame.with_columns(pl.Series(k, v, strict=False) for k, v in values.items())
