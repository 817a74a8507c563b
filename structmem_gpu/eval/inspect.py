"""Read a finished run (or a sweep of runs) as polars frames, joined for reading by a person.

Used by the notebooks (notebooks/*.ipynb) and by anyone poking at a run directory; it only
reads the run directory contract (DESIGN.md) and never runs pipeline logic. This module holds
runs, sweeps, scores and the answers table; the per-question and per-conversation views
(question_view, item_catalogue, request_events, memory_of) are in eval/provenance.py and
re-exported here, so every import below keeps working.

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

from structmem_gpu.artifacts import MANIFEST, RunDir
from structmem_gpu.errors import InputError

# Re-exported: the per-question / per-conversation views live in provenance.py; notebooks and
# tests keep importing them from here.
from structmem_gpu.eval.provenance import (
    Memory,
    QuestionView,
    evidence_events,
    item_catalogue,
    memory_of,
    question_view,
    request_events,
)
from structmem_gpu.eval.published import PublishedRow, load_published

__all__ = [
    "FAILURE_TYPES",
    "SWEEP_KEYS",
    "Memory",
    "QuestionView",
    "Run",
    "Sweep",
    "answers_table",
    "evidence_events",
    "failure_type",
    "headline_judge",
    "item_catalogue",
    "load",
    "load_run",
    "load_sweep",
    "memory_of",
    "published_rows",
    "question_view",
    "request_events",
    "scores_table",
    "sweep_frame",
]

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
