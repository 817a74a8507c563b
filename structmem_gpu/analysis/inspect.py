"""Read a finished run (or a sweep of runs) as polars frames, joined for reading by a person.

Used by the notebooks (notebooks/*.ipynb) and by anyone poking at a run directory; it only
reads the run directory contract (docs/design.md) and never runs pipeline logic. This module holds
sweeps and re-exports the rest: runs, scores and the answers table live in analysis/run.py,
the per-question and per-conversation views (question_view, item_catalogue, request_events,
memory_of) in analysis/provenance.py; both import run.py and neither imports this module.

    from structmem_gpu.analysis.inspect import answers_table, load_run, memory_of, question_view
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

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from structmem_gpu.core.artifacts import MANIFEST

# Re-exported: the per-question / per-conversation views live in provenance.py, runs and the
# answers table in run.py; notebooks and tests keep importing them from here.
from structmem_gpu.analysis.provenance import (
    Memory,
    QuestionView,
    evidence_events,
    item_catalogue,
    memory_of,
    question_view,
    request_events,
)
from structmem_gpu.analysis.run import (
    FAILURE_TYPES,
    Run,
    _resolve,
    answers_table,
    failure_type,
    headline_judge,
    load_run,
    published_rows,
    scores_table,
)
from structmem_gpu.core.errors import InputError

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

# Config keys a sweep usually varies (paper Fig. 3c/3d); load_sweep adds them as columns.
SWEEP_KEYS = ("consolidate.seed_k", "retrieve.entries_k", "retrieve.syntheses_k")


def load(path: str | Path) -> Run | Sweep:
    """A run directory as a Run; any other folder as the Sweep of the runs below it."""
    root = _resolve(path)
    if (root / MANIFEST).is_file():
        return Run(root)
    return load_sweep(root)


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
    """One row per finished run (structmem_gpu.analysis.compare) plus a column per config key."""
    from structmem_gpu.analysis.compare import compare_runs

    dirs = [Path(d) for d in run_dirs]
    frame = compare_runs(dirs)
    values = {k: [load_run(d).config_value(k) for d in dirs] for k in keys}
    return frame.with_columns(pl.Series(k, v, strict=False) for k, v in values.items())
