"""What `jobs/report.py compare`, `table1` and `agreement` do, so that the entry point stays a
thin parser (tests/unit/test_thin_entry_points.py): each writes its files and prints what a
user reads first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from structmem_gpu.core.errors import StructMemError


def compare_command(out: Path, dirs: Sequence[Path], reference: str | None) -> None:
    """comparison.md/.csv/.json with the paired tests and seed replicates, the sweep figures
    and the comparison's page, for the runs at or below `dirs`."""
    from structmem_gpu.analysis.compare import (
        compare_runs,
        discover_runs,
        write_comparison,
        write_comparison_page,
    )
    from structmem_gpu.analysis.comparison_stats import write_stats
    from structmem_gpu.analysis.sweep_plots import write_sweep_plots

    runs = discover_runs(*dirs)
    df = compare_runs(runs, reference=reference)
    paths = write_comparison(df, out, reference=reference)
    write_stats(df, out, reference=reference, md=paths["md"])  # paired tests, seeds
    print(paths["md"].read_text(encoding="utf-8"))
    for path in write_sweep_plots(runs, out):
        print(f"figure: {path}")
    print(f"page: {write_comparison_page(out, runs)}")


def table1_command(out: Path, dirs: Sequence[Path]) -> None:
    """table1.md/.csv/.json and its page (analysis/table1.py) for the runs at or below `dirs`."""
    from structmem_gpu.analysis.compare import discover_runs
    from structmem_gpu.analysis.table1 import table1, write_table1, write_table1_page

    runs = discover_runs(*dirs)
    paths = write_table1(table1(runs), out)
    print(paths["md"].read_text(encoding="utf-8"))
    print(f"page: {write_table1_page(out, runs)}")


def agreement_command(run_dir: Path, out: Path | None) -> None:
    """Cohen's kappa per judge pair and Fleiss' kappa of a run judged by a panel."""
    import polars as pl

    from structmem_gpu.core.artifacts import RunDir
    from structmem_gpu.eval.agreement import agreement_markdown, judge_agreement, write_agreement

    run = RunDir(run_dir)
    judgments = run.read_table("judgments")
    names = judgments["judge_name"].unique().to_list()
    if len(names) < 2:
        raise StructMemError(f"{run.table_path('judgments')}: only judge(s) {names}; agreement "
                             "needs several (run stages=[judge,report] judge=panel_example there)")
    table = judge_agreement(judgments.filter(pl.col("judge_name").is_not_null()))
    paths = write_agreement(table, out or run.report_dir)
    print(agreement_markdown(table))
    print(f"written: {paths['md']}, {paths['json']}")
