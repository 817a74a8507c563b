"""Figures of one run, written as PNG by the report stage (the only module that imports matplotlib).

    python jobs/run.py stages=[report] hydra.run.dir=DIR     # DIR/report/*.png (report.plots)
    # from code:
    write_run_plots(Path("outputs/runs/sample/structmem"), job)

One run (report/): accuracy_by_category.png (our judge accuracy with its 95% bootstrap CI,
the papers' published values beside it when the configuration matches a published row),
build_cost.png (calls, tokens, seconds per stage, from manifest.json), cumulative_build_tokens.png
(paper Fig. 3a, defined at `curves.cumulative_build_tokens`), evidence_recall_at_k.png (recall@k,
k = 1..entries_k). `plot_accuracy_vs` draws a sweep's accuracy_vs_<key>.png for
consolidate.seed_k (Fig. 3d) and retrieve.entries_k (Fig. 3c); the sweep figures are written by
analysis/sweep_plots.py.

Each figure function takes frames/dicts, returns the written path and raises NothingToPlot
(a ValueError and a StructMemError) on an empty input instead of drawing an empty plot.
Figures use matplotlib's object API with the Agg canvas: no pyplot, so no global backend state
is changed inside a notebook or a test process.

This module only draws. The frames behind the figures (category_accuracy, build_cost_frame,
cumulative_build_tokens, recall_at_k, ...), NothingToPlot and the published rows drawn beside
ours are computed in eval/curves.py, which imports no matplotlib; the public names are
re-exported here, so `plots.recall_at_k` and `plots.NothingToPlot` keep working.
"""

from __future__ import annotations

import io
import json
import logging
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir, atomic_write_bytes
from structmem_gpu.core.errors import InputError

# Re-exported: the frames behind the figures live in curves.py (no matplotlib); callers keep
# using plots.recall_at_k, plots.NothingToPlot, ... (notebooks, tests, jobs/report.py).
from structmem_gpu.eval.curves import (
    CUMULATIVE_REQUEST_COLUMNS,
    EVIDENCE_ENTRY_COLUMNS,
    EVIDENCE_SYNTHESIS_COLUMNS,
    TURN_POSITION_COLUMNS,
    NothingToPlot,
    _distinct_published,
    _published_sweep,
    build_cost_frame,
    category_accuracy,
    cumulative_build_tokens,
    recall_at_k,
    request_events,
    turn_positions,
)
from structmem_gpu.eval.published import PublishedRow, load_published, matching_rows
from structmem_gpu.stage_lookup import RunStages
from structmem_gpu.core.stage_parts import INPUT, QUESTION, REPORT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SWEEP_PLOTS",
    "NothingToPlot",
    "build_cost_frame",
    "category_accuracy",
    "cumulative_build_tokens",
    "plot_accuracy_by_category",
    "plot_accuracy_vs",
    "plot_build_cost",
    "plot_cumulative_build_tokens",
    "plot_recall_at_k",
    "recall_at_k",
    "turn_positions",
    "write_run_plots",
]

log = logging.getLogger(__name__)

SWEEP_PLOTS = {"consolidate.seed_k": "Fig. 3d", "retrieve.entries_k": "Fig. 3c"}


def _figure(width: float = 7.0, height: float = 4.0, ncols: int = 1) -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols)


def _save(fig: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    # No "Software" metadata: the same data gives the same bytes across matplotlib versions.
    fig.savefig(buf, format="png", metadata={"Software": None})
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


# ---- accuracy by category -------------------------------------------------------------------
def plot_accuracy_by_category(
    judged: pl.DataFrame, path: Path, published: Sequence[PublishedRow] = (), title: str = ""
) -> Path:
    """Bars of our judge accuracy per category (95% CI, n below), published values beside."""
    acc = category_accuracy(judged)
    pubs = _distinct_published(published)
    fig, ax = _figure(max(6.0, 1.3 * acc.height + 2), 4.2)
    x = np.arange(acc.height)
    width = 0.8 / (1 + len(pubs))
    ours = acc["accuracy"].to_numpy() * 100
    lo = acc["ci_low"].fill_null(acc["accuracy"]).to_numpy() * 100
    hi = acc["ci_high"].fill_null(acc["accuracy"]).to_numpy() * 100
    err = np.vstack([ours - lo, hi - ours])
    ax.bar(x, ours, width, yerr=err, capsize=3, label="this run (95% CI)", color="tab:blue")
    for i, p in enumerate(pubs, start=1):
        values = [
            p.overall.get("judge_accuracy")
            if c == -1
            else p.by_category.get("judge_accuracy", {}).get(str(c))
            for c in acc["category"]
        ]
        heights = [np.nan if v is None else v for v in values]
        label = textwrap.shorten(f"{p.label} ({p.source})", 90, placeholder="…)")
        ax.bar(x + i * width, heights, width, label=label, alpha=0.75)
    ticks = [f"{name}\nn={n}" for name, n in acc.select("category_name", "n").iter_rows()]
    ax.set_xticks(x + width * len(pubs) / 2, ticks, fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("judge accuracy (%)")
    ax.set_title(title or "Judge accuracy by category")
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


# ---- build cost per stage -------------------------------------------------------------------
def plot_build_cost(
    manifest: Mapping[str, Any], path: Path, order: Sequence[str] = (), title: str = "",
    stages: RunStages | None = None,
) -> Path:
    """Three panels per stage: LLM calls (cache hits shaded), prompt/completion tokens, seconds.
    Stages that do not build memory (Stage.kind input or question, as the run's method
    declares them: `stages`; None = the packaged methods') are hatched."""
    parts = stages if stages is not None else RunStages()
    df = build_cost_frame(manifest, order)
    fig, (a1, a2, a3) = _figure(min(16.0, max(9.0, 1.1 * df.height)), 3.8, ncols=3)
    x, names = np.arange(df.height), df["stage"].to_list()
    hatch = ["//" if parts.part(n) in (INPUT, QUESTION, REPORT) else "" for n in names]
    a1.bar(x, df["calls"], color="tab:blue", label="calls", hatch=hatch)
    a1.bar(x, df["cache_hits"], color="tab:gray", alpha=0.7, label="of which cache hits")
    a2.bar(x, df["prompt_tokens"], color="tab:orange", label="prompt", hatch=hatch)
    a2.bar(
        x,
        df["completion_tokens"],
        bottom=df["prompt_tokens"],
        color="tab:green",
        label="completion",
        hatch=hatch,
    )
    a3.bar(x, df["wall_s"], color="tab:purple", hatch=hatch)
    for ax, label in ((a1, "LLM calls"), (a2, "tokens"), (a3, "wall seconds")):
        ax.set_xticks(x, names, rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
    from matplotlib.patches import Patch

    # Explicit legend swatches: the first bar may be hatched, which the legend would copy.
    a1.legend(
        handles=[
            Patch(color="tab:blue", label="calls"),
            Patch(color="tab:gray", alpha=0.7, label="of which cache hits"),
        ],
        fontsize=7,
    )
    a2.legend(
        handles=[
            Patch(color="tab:orange", label="prompt"),
            Patch(color="tab:green", label="completion"),
        ],
        fontsize=7,
    )
    fig.suptitle(
        (title or "Build cost per stage (manifest.json)")
        + "; hatched: answering stages, not memory building",
        fontsize=10,
    )
    return _save(fig, path)


# ---- cumulative build tokens over dialogue turns (paper Fig. 3a) ----------------------------
def plot_cumulative_build_tokens(
    curves: pl.DataFrame | Mapping[str, pl.DataFrame], path: Path, title: str = ""
) -> Path:
    """One run's curve stacked by stage (a frame), or one total line per run/method (a dict)."""
    fig, ax = _figure(7.0, 4.2)
    if isinstance(curves, pl.DataFrame):
        if curves.height == 0:
            raise NothingToPlot("no memory-building requests in requests.parquet: nothing to plot")
        wide = curves.pivot(on="stage", index="turn", values="cumulative_tokens").sort("turn")
        stages = [c for c in wide.columns if c != "turn"]
        ax.stackplot(wide["turn"], *[wide[s] for s in stages], labels=stages, alpha=0.8)
    else:
        if not curves or all(c.height == 0 for c in curves.values()):
            raise NothingToPlot("no runs with memory-building requests: nothing to plot")
        for label, c in curves.items():
            total = c.group_by("turn").agg(pl.col("cumulative_tokens").sum()).sort("turn")
            ax.plot(total["turn"], total["cumulative_tokens"], label=label)
    ax.set_xlabel("dialogue turn (position within its conversation; conversations summed)")
    ax.set_ylabel("cumulative build tokens (prompt + completion)")
    ax.set_title(
        title or "Cumulative memory-building tokens over the dialogue (cf. paper Fig. 3a)",
        fontsize=10,
    )
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, path)


# ---- evidence recall@k ----------------------------------------------------------------------
def plot_recall_at_k(curves: pl.DataFrame, path: Path, title: str = "") -> Path:
    """Overall recall@k per circuit (solid), per category for the first circuit (dashed)."""
    if curves.height == 0:
        raise NothingToPlot("no retrieved question with resolvable evidence: nothing to plot")
    fig, ax = _figure(7.0, 4.2)
    circuits = curves["circuit"].unique(maintain_order=True).to_list()
    for circuit in circuits:
        c = curves.filter((pl.col("circuit") == circuit) & (pl.col("category_name") == "all"))
        ax.plot(
            c["k"],
            c["recall"] * 100,
            lw=2,
            marker="o",
            ms=3,
            label=f"{circuit}: all (n={c['n'][0]})",
        )
    main = curves.filter((pl.col("circuit") == circuits[0]) & (pl.col("category_name") != "all"))
    for i, ((name,), c) in enumerate(main.group_by(["category_name"], maintain_order=True)):
        # Colours after the circuits' own, so a category never shares a circuit's colour.
        ax.plot(
            c["k"],
            c["recall"] * 100,
            ls="--",
            lw=1,
            color=f"C{(len(circuits) + i) % 10}",
            label=f"{circuits[0]}: {name} (n={c['n'][0]})",
        )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k (top-k retrieved items of the circuit)")
    ax.set_ylabel("evidence recall@k (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title or "Evidence recall@k", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncols=2)
    return _save(fig, path)


# ---- sweeps (paper Fig. 3c / 3d) ------------------------------------------------------------
def plot_accuracy_vs(
    sweep: pl.DataFrame, key: str, path: Path, published: Sequence[PublishedRow] | None = None
) -> Path:
    """Overall judge accuracy (95% CI) against a config value, one line per method.

    `sweep`: structmem_gpu.analysis.inspect.sweep_frame (or compare_runs plus a `key` column).
    `published` (default: every published row whose match varies `key` and fits the sweep's
    benchmark and method) is drawn as the paper's line."""
    if key not in sweep.columns:
        raise NothingToPlot(f"the sweep frame has no column {key!r}: nothing to plot")
    df = sweep.filter(pl.col(key).is_not_null() & pl.col("acc_overall").is_not_null()).sort(key)
    if df.height == 0:
        raise NothingToPlot(f"no run with judged questions and a value of {key}: nothing to plot")
    fig, ax = _figure(6.5, 4.0)
    for (method,), g in df.group_by(["method"], maintain_order=True):
        y = g["acc_overall"].to_numpy() * 100
        lo = g["acc_overall_ci_low"].fill_null(g["acc_overall"]).to_numpy() * 100
        hi = g["acc_overall_ci_high"].fill_null(g["acc_overall"]).to_numpy() * 100
        x = g[key].to_numpy()
        line = ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="o", capsize=3,
                           label=f"{method} (this sweep)")
        ax.fill_between(x, lo, hi, alpha=0.15, color=line[0].get_color(), linewidth=0)  # 95% CI
    if published is None:
        published = _published_sweep(df, key)
    # A set: the paper's default (K = 15) is both its Table 1 row and a Fig. 3d point.
    pts = sorted(
        {
            (p.match[key], p.overall["judge_accuracy"])
            for p in published
            if p.match and key in p.match and "judge_accuracy" in p.overall
        }
    )
    if pts:
        ax.plot(
            *zip(*pts), marker="s", ls="--", color="black", label=f"paper ({published[0].paper})"
        )
    ax.set_xlabel(key)
    ax.set_ylim(0, 100)
    ax.set_ylabel("judge accuracy (%)")
    ax.set_title(f"Accuracy vs {key} ({SWEEP_PLOTS.get(key, 'sweep')})", fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, path)


# ---- entry points ---------------------------------------------------------------------------
def try_draw(name: str, draw: Callable[[], Path], written: list[Path]) -> None:
    """Draw one figure; an empty input skips it (logged), any other error propagates."""
    try:
        written.append(draw())
    except NothingToPlot as err:
        log.info("plot %s skipped: %s", name, err)


def write_run_plots(
    run_dir: Path,
    job: JobConfig | None = None,
    out_dir: Path | None = None,
    published: Sequence[PublishedRow] | None = None,
) -> list[Path]:
    """The figures of one (possibly merged) run into `out_dir` (default <run_dir>/report/).

    `job` selects the published rows drawn beside ours and gives the stage order; without it
    the rows report/report.json lists are drawn (or `published`), stages in run order.
    """
    run = RunDir(run_dir)
    if not run.manifest_path.is_file() and not run.tables_dir.is_dir():
        raise InputError(run.root, "not a run directory (no manifest.json and no tables/)")
    manifest = run.load_manifest()
    report_json = run.report_dir / "report.json"
    report = json.loads(report_json.read_text(encoding="utf-8")) if report_json.is_file() else {}
    out = Path(out_dir) if out_dir is not None else run.report_dir
    title = f"{manifest.get('benchmark')} / {manifest.get('method')}"
    written: list[Path] = []
    judgments = run.read_table("judgments") if run.has_table("judgments") else None

    def accuracy() -> Path:
        assert judgments is not None
        names = judgments["judge_name"].drop_nulls().unique(maintain_order=True).to_list()
        judge = report.get("judge") or (names[0] if names else None)
        questions = run.read_table("questions")
        judged = judgments.filter(pl.col("judge_name") == judge).join(
            questions.select("question_id", "category", "category_name"), on="question_id"
        )
        if published is not None:
            pubs: Sequence[PublishedRow] = published
        elif job is not None:
            pubs = matching_rows(job)
        else:
            ids = set(report.get("published") or ())
            pubs = [r for r in load_published() if r.id in ids]
        return plot_accuracy_by_category(
            judged,
            out / "accuracy_by_category.png",
            pubs,
            f"Judge accuracy by category: {title} (judge {judge})",
        )

    stages = RunStages(run.root, manifest)
    order = list(job.root.method.stages) if job is not None else list(stages.order)
    if judgments is not None:
        try_draw("accuracy_by_category", accuracy, written)
    try_draw(
        "build_cost",
        lambda: plot_build_cost(
            manifest, out / "build_cost.png", order, f"Build cost per stage: {title}", stages
        ),
        written,
    )
    if run.has_table("requests") and run.has_table("turns"):
        try_draw(
            "cumulative_build_tokens",
            lambda: plot_cumulative_build_tokens(
                cumulative_build_tokens(
                    run.read_table("requests", columns=CUMULATIVE_REQUEST_COLUMNS),
                    run.read_table("turns", columns=TURN_POSITION_COLUMNS),
                    request_events(run), stages,
                ),
                out / "cumulative_build_tokens.png",
                f"Cumulative build tokens: {title}",
            ),
            written,
        )
    if run.has_table("retrievals"):
        try_draw(
            "evidence_recall_at_k",
            lambda: plot_recall_at_k(
                recall_at_k(
                    run.read_table("questions"),
                    run.read_table("retrievals"),
                    _optional(run, "entries", EVIDENCE_ENTRY_COLUMNS),
                    _optional(run, "syntheses", EVIDENCE_SYNTHESIS_COLUMNS),
                ),
                out / "evidence_recall_at_k.png",
                f"Evidence recall@k: {title}",
            ),
            written,
        )
    log.info("plots: %s", ", ".join(p.name for p in written) or "none")
    return written


def _optional(run: RunDir, name: str, columns: Sequence[str] | None = None) -> pl.DataFrame | None:
    return run.read_table(name, columns=columns) if run.has_table(name) else None
