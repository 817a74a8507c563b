"""structmem_gpu.eval.plots and analysis.sweep_plots: the report stage's PNGs, a sweep's, the
curves behind them, empty inputs.

python -m pytest tests/unit -q -k plots
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.analysis import sweep_plots
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval import plots
from structmem_gpu.analysis.inspect import load_run, request_events, sweep_frame
from structmem_gpu.eval.published import load_published
from structmem_gpu.core.schemas import (
    ENTRIES,
    JUDGMENTS,
    QUESTIONS,
    REQUESTS,
    RETRIEVALS,
    TURNS,
    empty,
    frame,
)
from tests.fixtures.pipeline import compose_cfg, run_pipeline
from tests.unit.test_inspect import SCRIPTED, build_scripted_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_FIGURES = (
    "accuracy_by_category.png",
    "build_cost.png",
    "cumulative_build_tokens.png",
    "evidence_recall_at_k.png",
)


@pytest.fixture(scope="session")
def scripted_sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_scripted_run(tmp_path_factory)


def assert_png(path: Path) -> None:
    """A non-empty PNG that PIL (and matplotlib) can decode, with a plausible size."""
    from matplotlib.image import imread
    from PIL import Image

    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), f"{path} is not a PNG"
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.width > 200 and img.height > 200
    assert imread(path).ndim == 3


def test_report_stage_writes_the_figures(scripted_sample_run: Path) -> None:
    report = scripted_sample_run / "report"
    for name in RUN_FIGURES:
        assert_png(report / name)


def test_report_plots_switch_off(scripted_sample_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(scripted_sample_run, run_dir)
    for png in (run_dir / "report").glob("*.png"):
        png.unlink()
    # ++: works whether or not conf/config.yaml already declares report.plots.
    run_pipeline(
        [
            *SCRIPTED,
            "stages=[report]",
            "force=true",
            "++report.plots=false",
            f"paths.cache_dir={tmp_path / 'cache'}",
        ],
        run_dir,
    )
    assert (run_dir / "report" / "report.json").is_file()
    assert not list((run_dir / "report").glob("*.png"))


# ---- empty inputs are rejected with the table's name -------------------------------------
def test_nothing_to_plot_is_a_value_and_structmem_error() -> None:
    assert issubclass(plots.NothingToPlot, ValueError)
    assert issubclass(plots.NothingToPlot, StructMemError)


@pytest.mark.parametrize(
    "draw, message",
    [
        (
            lambda out: plots.plot_accuracy_by_category(
                empty(JUDGMENTS).with_columns(
                    pl.lit(1).alias("category"), pl.lit("x").alias("category_name")
                ),
                out,
            ),
            "no judged questions in judgments.parquet: nothing to plot",
        ),
        (
            lambda out: plots.plot_build_cost({"stages": {}}, out),
            "no stage with a build_cost in manifest.json: nothing to plot",
        ),
        (
            lambda out: plots.plot_cumulative_build_tokens(
                plots.cumulative_build_tokens(empty(REQUESTS), empty(TURNS)), out
            ),
            "no memory-building requests in requests.parquet: nothing to plot",
        ),
        (
            lambda out: plots.plot_cumulative_build_tokens({}, out),
            "no runs with memory-building requests: nothing to plot",
        ),
        (
            lambda out: plots.plot_recall_at_k(
                plots.recall_at_k(empty(QUESTIONS), empty(RETRIEVALS)), out
            ),
            "no retrieved question with resolvable evidence in retrievals.parquet: nothing to plot",
        ),
        (
            lambda out: plots.plot_accuracy_vs(
                pl.DataFrame(
                    {"method": ["m"], "acc_overall": [None], "consolidate.seed_k": [5]},
                    schema_overrides={"acc_overall": pl.Float64},
                ),
                "consolidate.seed_k",
                out,
            ),
            "no run with judged questions and a value of consolidate.seed_k: nothing to plot",
        ),
    ],
)
def test_empty_tables_are_rejected(draw, message: str, tmp_path: Path) -> None:
    out = tmp_path / "figure.png"
    with pytest.raises(plots.NothingToPlot, match=message):
        draw(out)
    assert not out.exists(), "no empty figure is written"


def test_unjudged_only_is_empty(tmp_path: Path) -> None:
    rows = pl.DataFrame(
        {"question_id": ["q"], "category": [1], "category_name": ["multi-hop"], "label": [None]},
        schema_overrides={"label": pl.Boolean},
    )
    with pytest.raises(ValueError, match="no judged questions in judgments.parquet"):
        plots.plot_accuracy_by_category(rows, tmp_path / "a.png")


# ---- the curves ---------------------------------------------------------------------------
def _turns(n: int, conv: str = "c1") -> pl.DataFrame:
    t = datetime(2024, 1, 1)
    return frame(
        [
            {
                "conv_id": conv,
                "session_index": 1,
                "session_id": "S1",
                "session_hash": "h",
                "session_time": t,
                "turn_index": i,
                "dia_id": f"D1:{i + 1}",
                "event_id": f"{conv}:D1:{i + 1}",
                "speaker": "A",
                "text": "x",
                "image_caption": None,
                "has_answer": None,
            }
            for i in range(n)
        ],
        TURNS,
    )


def _entry(eid: str, event: str, request: str) -> dict:
    return {
        "entry_id": eid,
        "conv_id": "c1",
        "event_id": event,
        "dia_id": event.split(":", 1)[1],
        "session_index": 1,
        "turn_index": 0,
        "event_time": datetime(2024, 1, 1),
        "speaker": "A",
        "kind": "fact",
        "text": eid,
        "request_id": request,
        "prompt_version": "v",
        "model": "m",
    }


def _request(rid: str, stage: str, tokens: int, conv: str | None = "c1") -> dict:
    return {
        "request_id": rid,
        "stage": stage,
        "conv_id": conv,
        "prompt_tokens": tokens,
        "completion_tokens": 1,
        "parse_ok": True,
        "cache_hit": False,
    }


def test_cumulative_tokens_charge_the_last_covered_turn() -> None:
    entries = frame([_entry("e1", "c1:D1:1", "r1"), _entry("e2", "c1:D1:2", "r1")], ENTRIES)
    requests = pl.DataFrame(
        [
            _request("r1", "extract", 99),
            _request("r2", "extract", 9),
            _request("a1", "answer", 1000),
        ]
    )
    links = entries.select("request_id", "event_id")
    curve = plots.cumulative_build_tokens(requests, _turns(4), links)
    tokens = dict(curve.select("turn", "tokens").iter_rows())
    # r1 covers turns 1-2: sent once turn 2 exists; r2 wrote no entry: charged at the end;
    # the answer request builds no memory and is left out.
    assert tokens == {1: 0, 2: 100, 3: 0, 4: 10}
    assert curve["cumulative_tokens"].to_list() == [0, 100, 100, 110]


def test_cumulative_tokens_of_the_sample_run(scripted_sample_run: Path) -> None:
    run = load_run(scripted_sample_run)
    links = request_events(run)
    # Every extraction and synthesis request of the scripted run is placed at a turn.
    build_ids = run.requests.filter(pl.col("stage").is_in(["extract", "consolidate"]))["request_id"]
    assert set(build_ids) == set(links["request_id"])
    curve = plots.cumulative_build_tokens(run.requests, run.turns, links)
    build = run.requests.filter(pl.col("stage").is_in(["extract", "consolidate"]))
    final = curve.group_by("stage").agg(pl.col("cumulative_tokens").last())
    assert (
        final["cumulative_tokens"].sum()
        == build["prompt_tokens"].sum() + build["completion_tokens"].sum()
    )
    assert set(final["stage"]) == {"extract", "consolidate"}
    assert curve["turn"].max() == run.turns.group_by("conv_id").len()["len"].max()
    for _, g in curve.group_by("stage"):
        assert g["cumulative_tokens"].diff().drop_nulls().min() >= 0


def test_recall_at_k_by_rank() -> None:
    questions = frame(
        [
            {
                "conv_id": "c1",
                "question_id": "q",
                "question": "?",
                "answer": "a",
                "adversarial_answer": None,
                "category": 1,
                "category_name": "multi-hop",
                "evidence": ["D1:1", "D1:3"],
                "evidence_raw": ["D1:1", "D1:3"],
                "question_time": None,
                "is_abstention": False,
            }
        ],
        QUESTIONS,
    )
    entries = frame([_entry(f"e{i}", f"c1:D1:{i}", "r") for i in (1, 2, 3)], ENTRIES)
    retrievals = pl.DataFrame(
        {
            "question_id": ["q"] * 3,
            "conv_id": ["c1"] * 3,
            "circuit": ["entries"] * 3,
            "rank": [0, 1, 2],
            "item_id": ["e2", "e1", "e3"],
            "score": [0.9, 0.8, 0.7],
        }
    )
    curve = plots.recall_at_k(questions, retrievals, entries)
    all_ = curve.filter(pl.col("category_name") == "all").sort("k")
    assert all_["recall"].to_list() == [0.0, 0.5, 1.0]
    assert set(curve["category_name"]) == {"all", "multi-hop"}


def test_recall_at_k_agrees_with_judged_recall(scripted_sample_run: Path) -> None:
    run = load_run(scripted_sample_run)
    curve = plots.recall_at_k(run.questions, run.retrievals, run.entries, run.syntheses)
    judged = run.report["overall"]["evidence_recall"]
    for (circuit,), c in curve.filter(pl.col("category_name") == "all").group_by(["circuit"]):
        assert c["recall"].diff().drop_nulls().min() >= 0, "recall@k never decreases"
        # One circuit alone covers at most what all circuits together cover (judge stage).
        assert c["recall"].max() <= judged + 1e-9, circuit


def test_category_accuracy_matches_report(scripted_sample_run: Path) -> None:
    run = load_run(scripted_sample_run)
    judged = run.judgments.join(
        run.questions.select("question_id", "category", "category_name"), on="question_id"
    )
    acc = plots.category_accuracy(judged)
    by_cat = run.report["by_category"]
    for cat, n, value in (
        acc.filter(pl.col("category") >= 0).select("category", "n", "accuracy").iter_rows()
    ):
        assert (n, value) == (
            by_cat[str(cat)]["n"],
            pytest.approx(by_cat[str(cat)]["judge_accuracy"]),
        )


def test_published_values_drawn_when_config_matches(
    scripted_sample_run: Path, tmp_path: Path
) -> None:
    cfg = compose_cfg([*SCRIPTED, "benchmark.name=locomo"])  # StructMem defaults: seed_k 15
    written = plots.write_run_plots(scripted_sample_run, JobConfig.from_cfg(cfg), out_dir=tmp_path)
    assert sorted(p.name for p in written) == sorted(RUN_FIGURES)
    pubs = plots._distinct_published(
        [
            r
            for r in load_published()
            if r.id.startswith("structmem-") and r.id in ("structmem-table1", "structmem-fig3d-k15")
        ]
    )
    assert [p.id for p in pubs] == ["structmem-table1"], "the K=15 point repeats Table 1"
    for path in written:
        assert_png(path)


# ---- sweeps -------------------------------------------------------------------------------
def _sweep(tmp_path: Path, run_dir: Path, values: tuple[int, ...]) -> list[Path]:
    dirs = []
    for k in values:
        d = tmp_path / f"consolidate.seed_k={k}"
        shutil.copytree(run_dir, d)
        manifest = json.loads((d / "manifest.json").read_text())
        manifest["stages"]["consolidate"]["config"]["consolidate"]["seed_k"] = k
        (d / "manifest.json").write_text(json.dumps(manifest))
        dirs.append(d)
    return dirs


def test_write_sweep_plots(scripted_sample_run: Path, tmp_path: Path) -> None:
    dirs = _sweep(tmp_path, scripted_sample_run, (0, 5, 15))
    written = sweep_plots.write_sweep_plots(dirs, tmp_path / "out")
    # entries_k is the same in every run: no Fig. 3c panel for a key the sweep does not vary.
    assert sorted(p.name for p in written) == [
        "accuracy_vs_seed_k.png",
        "cumulative_build_tokens.png",
    ]
    for path in written:
        assert_png(path)
    with pytest.raises(plots.NothingToPlot, match="no finished run"):
        sweep_plots.write_sweep_plots([], tmp_path / "none")


def test_accuracy_vs_seed_k_with_paper_line(scripted_sample_run: Path, tmp_path: Path) -> None:
    table = sweep_frame(_sweep(tmp_path, scripted_sample_run, (0, 15)))
    table = table.with_columns(pl.lit("locomo").alias("benchmark"))
    paper = plots._published_sweep(table, "consolidate.seed_k")
    assert {p.match["consolidate.seed_k"] for p in paper} == {0, 5, 10, 15, 20}
    assert_png(plots.plot_accuracy_vs(table, "consolidate.seed_k", tmp_path / "fig3d.png"))
    with pytest.raises(plots.NothingToPlot, match="no column 'retrieve.turns_k'"):
        plots.plot_accuracy_vs(table, "retrieve.turns_k", tmp_path / "x.png")


def test_a_figure_per_varied_numeric_override(scripted_sample_run: Path, tmp_path: Path) -> None:
    """Any numeric key a sweep varies (from .hydra/overrides.yaml) gets its accuracy figure."""
    dirs = []
    for k in (2, 8, 4):
        d = tmp_path / f"seem.retrieve.passage_k={k}"
        shutil.copytree(scripted_sample_run, d)
        (d / ".hydra").mkdir(exist_ok=True)
        (d / ".hydra" / "overrides.yaml").write_text(f"- seem.retrieve.passage_k={k}\n- debug=scripted\n")
        dirs.append(d)
    written = sweep_plots.write_sweep_plots(dirs, tmp_path / "out")
    assert "accuracy_vs_passage_k.png" in [p.name for p in written]
    assert_png(tmp_path / "out" / "accuracy_vs_passage_k.png")
