"""A finished run directory read as polars frames: `Run`, `load_run` and the answers table.

The base of the notebook-side analysis (structmem_gpu.analysis): it reads the run directory
contract (docs/design.md) only and imports no pipeline stage. inspect.py and provenance.py both
build on it (neither imports the other's internals any more).

    run = load_run("outputs/runs/sample/structmem")
    answers_table(run).filter(pl.col("failure") == "evidence_missed")
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import MANIFEST, RunDir
from structmem_gpu.core.errors import InputError
from structmem_gpu.eval.published import PublishedRow, load_published, row_matches

log = logging.getLogger(__name__)

# What went wrong with one answer (column `failure` of answers_table), in the order a reader
# would check: no verdict, no answer, then how much of the evidence the memory handed over.
FAILURE_TYPES: dict[str, str] = {
    "correct": "the judge labelled the answer CORRECT",
    "unjudged": "the judge's reply had no readable label (counted as wrong in judge_accuracy)",
    "no_answer": "the answer request failed or returned an empty reply",
    "evidence_missed": "wrong; retrieval covered none of the evidence turns",
    "evidence_partial": "wrong; retrieval covered some but not all evidence turns",
    "evidence_retrieved": "wrong although retrieval covered every evidence turn (answering failed)",
    "no_evidence": "wrong; the question has no resolvable evidence or the run no retrievals",
}
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
        names = {p.stem for p in self.dir.tables_dir.glob("*.parquet")}
        if self.dir.has_table("turns"):  # the compact layout's parts stand for it (turns_store.py)
            names.add("turns")
        return sorted(names)

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
        if not self.dir.table_path(name).exists():  # compact turns: expanded (turns_store.py)
            return self.table(name).lazy()
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
            from structmem_gpu.eval.published import saved_value

            return saved_value(hydra_cfg, key)
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


def published_rows(run: Run) -> list[PublishedRow]:
    """Published figures comparable with this run: the ids its report.json lists, else the
    rows that match its recorded configuration (eval/published.py's row_matches, from the
    manifest and .hydra/config.yaml instead of a live Hydra config)."""
    rows = load_published()
    if run.report is not None and "published" in run.report:
        ids = set(run.report["published"])
        return [r for r in rows if r.id in ids]
    return [r for r in rows if row_matches(run.config_value, r)]


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
    answers = run.answers
    if "reasoning" not in answers.columns:  # runs written before the paper reader
        answers = answers.with_columns(pl.lit(None, pl.String()).alias("reasoning"))
    a = answers.select(
        "question_id",
        "prediction",
        "reasoning",
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
        "reasoning",
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


