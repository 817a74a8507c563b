"""Figures comparing finished runs (a sweep, or methods side by side), written as PNG.

    python jobs/report.py compare OUT SWEEP_DIR                # OUT/*.png beside comparison.md
    write_sweep_plots(discover_runs(Path("outputs/multirun/sample/2026-05-01_12-00-00")), out)

accuracy_vs_<key>.png (95% CI bands) for every numeric override the runs vary (read from their
.hydra/overrides.yaml by analysis/compare.py; consolidate.seed_k and retrieve.entries_k also
from the manifest, with the paper's Fig. 3d / 3c line), and cumulative build tokens per run. The drawing is eval/plots.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import polars as pl

from structmem_gpu.analysis.compare import compare_runs, label_columns
from structmem_gpu.analysis.inspect import Run, load_run, request_events
from structmem_gpu.eval.curves import NothingToPlot, cumulative_build_tokens
from structmem_gpu.stage_lookup import RunStages
from structmem_gpu.eval.plots import (
    SWEEP_PLOTS,
    plot_accuracy_vs,
    plot_cumulative_build_tokens,
    try_draw,
)

log = logging.getLogger(__name__)


def run_label(run: Run, others: Sequence[Run]) -> str:
    """Method name, plus the directory name when several runs share the method."""
    same = [r for r in others if r.method == run.method]
    return str(run.method) if len(same) <= 1 else f"{run.method} [{run.root.name}]"


def write_sweep_plots(run_dirs: Iterable[Path], out_dir: Path) -> list[Path]:
    """Figures comparing finished runs (a sweep, or methods side by side) into `out_dir`."""
    runs = [load_run(d) for d in run_dirs]
    finished = [r for r in runs if r.report is not None]
    if not finished:
        raise NothingToPlot(
            "no finished run (report/report.json) among the given directories: nothing to plot"
        )
    out_dir = Path(out_dir)
    written: list[Path] = []
    frame = compare_runs([r.root for r in finished])
    # Fig. 3c/3d keys the overrides do not name (runs without .hydra/ records): the values the
    # stages recorded, by run (compare_runs sorts its rows).
    extra = [k for k in SWEEP_PLOTS if k not in frame.columns]
    by_dir = {str(r.root): r for r in finished}
    frame = frame.with_columns(
        pl.Series(k, [by_dir[d].config_value(k) for d in frame["run_dir"]], strict=False)
        for k in extra
    )
    numeric = [k for k in [*label_columns(frame), *extra] if frame[k].dtype.is_numeric()]
    for key in dict.fromkeys(numeric):  # one figure per varied numeric key, e.g. entries_k
        if frame[key].drop_nulls().n_unique() > 1:  # a key the runs do not vary is no sweep
            try_draw(
                f"accuracy_vs_{key}",
                lambda k=key: plot_accuracy_vs(
                    frame, k, out_dir / f"accuracy_vs_{k.split('.')[-1]}.png"
                ),
                written,
            )
    curves: dict[str, pl.DataFrame] = {}
    for r in finished:
        if r.has("requests") and r.has("turns"):
            try:
                curves[run_label(r, finished)] = cumulative_build_tokens(
                    r.requests, r.turns, request_events(r), RunStages(r.root)
                )
            except NothingToPlot as err:
                log.info("%s: %s", r.root, err)
    try_draw(
        "cumulative_build_tokens",
        lambda: plot_cumulative_build_tokens(curves, out_dir / "cumulative_build_tokens.png"),
        written,
    )
    log.info("sweep plots: %s", ", ".join(p.name for p in written) or "none")
    return written
