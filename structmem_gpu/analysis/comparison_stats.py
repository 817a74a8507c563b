"""The statistics sections of a comparison: paired tests against the reference run, build-seed
replicates. Used by `jobs/report.py compare` (appended to comparison.md) and by the sweep
summary at the end of a multirun (appended to sweep_summary.md).

    df = compare_runs(run_dirs)
    text, paths = write_stats(df, out_dir, reference="structmem", md=out_dir / "comparison.md")

The reference run: `reference` names a run directory among the compared runs, or a method, then
the first run of that method in the table's order (rows sorted by the varied overrides, so the
lowest value of a sweep); when no run matches, the table's first run. Files: paired.csv and
paired.json (one row per run, judge and group: analysis/paired.py), seeds.json
(analysis/seeds.py; only when runs differ in `llm.seed`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.analysis.compare import label_columns, short_labels
from structmem_gpu.analysis.paired import paired_comparison, paired_markdown
from structmem_gpu.analysis.seeds import seed_groups, seeds_markdown
from structmem_gpu.core.artifacts import atomic_write_text

log = logging.getLogger(__name__)


def reference_run(df: pl.DataFrame, reference: str | None) -> str:
    """The run directory the paired tests refer to (see the module doc)."""
    dirs = df["run_dir"].to_list()
    if reference:
        want = Path(reference).resolve()
        for d in dirs:
            if Path(d).resolve() == want:
                return str(d)
        same = df.filter(pl.col("method") == reference)["run_dir"].to_list()
        if same:
            return str(same[0])
    return str(dirs[0])


def run_labels(df: pl.DataFrame) -> dict[str, str]:
    """run_dir -> a short label: the varied overrides (`seed_k=5, method=flat`), else the
    directory name."""
    keys = label_columns(df)
    short = short_labels(keys)
    out = {}
    for r in df.iter_rows(named=True):
        parts = [f"{s}={r[k]}" for k, s in zip(keys, short, strict=True) if r[k] is not None]
        if "method" not in keys and df["method"].n_unique() > 1:
            parts.insert(0, str(r["method"]))
        out[str(r["run_dir"])] = ", ".join(parts) or Path(r["run_dir"]).name
    return out


def stats_sections(
    df: pl.DataFrame, reference: str | None
) -> tuple[str, list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """(markdown of both sections, paired rows, refusal lines, seed groups)."""
    labels = run_labels(df)
    ref = reference_run(df, reference)
    rows, refused = paired_comparison(Path(ref), [Path(d) for d in df["run_dir"].to_list()])
    groups = seed_groups(df)
    text = paired_markdown(rows, refused, labels, labels.get(ref, ref))
    seeds = seeds_markdown(groups)
    return text + ("\n" + seeds if seeds else ""), rows, refused, groups


def write_stats(
    df: pl.DataFrame, out_dir: Path, reference: str | None = "structmem", md: Path | None = None
) -> tuple[str, dict[str, Path]]:
    """Write paired.csv/.json (+ seeds.json) to `out_dir`; append the sections to `md`."""
    out_dir = Path(out_dir)
    text, rows, refused, groups = stats_sections(df, reference)
    paths = {"paired_csv": out_dir / "paired.csv", "paired_json": out_dir / "paired.json"}
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    atomic_write_text(paths["paired_csv"], frame.write_csv())
    atomic_write_text(paths["paired_json"],
                      json.dumps({"rows": rows, "refused": refused}, indent=2, default=str) + "\n")
    if groups:
        paths["seeds_json"] = out_dir / "seeds.json"
        atomic_write_text(paths["seeds_json"], json.dumps(groups, indent=2, default=str) + "\n")
    if md is not None:
        before = md.read_text(encoding="utf-8") if md.is_file() else ""
        atomic_write_text(md, before + ("\n" if before else "") + text)
    log.info("paired comparisons: %d rows, %d runs refused", len(rows), len(refused))
    return text, paths
