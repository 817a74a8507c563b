"""analysis/compare.py: one row per run from report.json + manifest.json; md/csv/json output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from jobs.report import main as report_main
from structmem_gpu.errors import InputError
from structmem_gpu.analysis.compare import compare_runs, discover_runs, write_comparison

CATS = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop"}


def _cost(calls: int, batches: int = 1, wall: float = 1.0) -> dict[str, Any]:
    return {
        "calls": calls,
        "cache_hits": 0,
        "prompt_tokens": 100 * calls,
        "completion_tokens": 10 * calls,
        "wall_s": wall,
        "batches": batches,
    }


def fake_run(
    root: Path,
    method: str,
    build: dict[str, dict[str, Any]],
    acc: float = 0.5,
    protocols: dict[str, str] | None = None,
) -> Path:
    run = root / f"method={method}"
    (run / "report").mkdir(parents=True)
    group = {
        "n": 4,
        "judge_accuracy": acc,
        "judge_accuracy_ci95": [0.1, 0.9],
        "f1_locomo": 0.3,
        "f1_mem0": 0.2,
        "bleu1": 0.25,
        "evidence_recall": 0.75,
    }
    report = {
        "benchmark": "sample",
        "method": method,
        "judge": "same_as_llm",
        "unjudged": 0,
        **({"protocols": protocols} if protocols else {}),
        "overall": {"name": "overall", **group},
        "by_category": {
            c: {"name": n, **group, "judge_accuracy": acc / int(c)} for c, n in CATS.items()
        },
    }
    stages = {name: {"status": "done", "build_cost": cost} for name, cost in build.items()}
    stages.update(
        {
            "load": {"build_cost": _cost(0, 0)},
            "retrieve": {"build_cost": _cost(0, 0, 9.0)},
            "answer": {"build_cost": _cost(4)},
            "judge": {"build_cost": _cost(4)},
            "report": {"build_cost": _cost(0, 0)},
        }
    )
    (run / "report" / "report.json").write_text(json.dumps(report))
    (run / "manifest.json").write_text(
        json.dumps(
            {
                "method": method,
                "benchmark": "sample",
                "config_hash": f"h-{method}",
                "stages": stages,
            }
        )
    )
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        fake_run(tmp_path, "flat", {"extract": _cost(3), "embed": _cost(0, 0)}),
        fake_run(
            tmp_path,
            "graph_memory",
            {"extract": _cost(3), "embed": _cost(0, 0), "graph": _cost(12, 8, 5.5)},
        ),
        fake_run(
            tmp_path,
            "structmem",
            {"extract": _cost(6), "embed": _cost(0, 0), "consolidate": _cost(2)},
        ),
    ]


def test_one_row_per_run_with_scores_and_build_cost(runs: list[Path]) -> None:
    df = compare_runs(runs)
    assert df["method"].to_list() == ["flat", "graph_memory", "structmem"]
    assert [c for c in df.columns if c.startswith("acc_")][:5] == [
        "acc_overall",
        "acc_overall_ci_low",
        "acc_overall_ci_high",
        "acc_multi_hop",
        "acc_temporal",
    ]
    g = df.row(1, named=True)
    assert g["n"] == 4 and g["acc_overall"] == 0.5 and g["acc_single_hop"] == 0.125
    assert g["f1_locomo"] == 0.3 and g["evidence_recall"] == 0.75
    # Build = every stage except load/retrieve/answer/judge/report.
    assert g["build_calls"] == 15 and g["build_batches"] == 9 and g["build_prompt_tokens"] == 1500
    assert g["build_wall_s"] == 7.5 and g["answer_calls"] == 4
    assert df["build_calls_vs_ref"].to_list() == [0.38, 1.88, 1.0]  # relative to structmem's 8


def test_write_comparison_md_csv_json(runs: list[Path], tmp_path: Path) -> None:
    df = compare_runs(runs)
    paths = write_comparison(df, tmp_path / "out")
    md = paths["md"].read_text()
    assert "| graph_memory | sample | reasoned/reasoned | 4 | 50.0 |" in md
    assert "×1.88" in md and "## Build cost" in md
    assert pl.read_csv(paths["csv"])["method"].to_list() == df["method"].to_list()
    assert [r["build_calls"] for r in json.loads(paths["json"].read_text())] == [3, 15, 8]


def test_discover_runs_and_cli(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert discover_runs(tmp_path) == sorted(runs)
    assert report_main(["compare", str(tmp_path / "cmp"), str(tmp_path)]) == 0
    assert (
        "| structmem |" in capsys.readouterr().out
        and (tmp_path / "cmp" / "comparison.csv").is_file()
    )


def test_missing_report_and_no_reference(tmp_path: Path, runs: list[Path]) -> None:
    (tmp_path / "broken").mkdir()
    with pytest.raises(InputError, match="report.json"):
        compare_runs([tmp_path / "broken"])
    with pytest.raises(InputError, match="no run directories"):
        compare_runs([])
    df = compare_runs(runs[:2])  # no structmem run: no ratio
    assert df["build_calls_vs_ref"].null_count() == 2


def test_rows_with_other_protocols_are_marked(tmp_path: Path) -> None:
    paper = {"answer": "paper", "judge": "paper"}
    runs = [
        fake_run(tmp_path / "a", "structmem", {"extract": _cost(8)}, protocols=paper),
        fake_run(tmp_path / "b", "flat", {"extract": _cost(4)}, protocols=paper),
        fake_run(
            tmp_path / "c",
            "graph_memory",
            {"extract": _cost(4)},
            protocols={"answer": "paper", "judge": "reasoned"},
        ),
    ]
    df = compare_runs(runs)
    assert df["protocols"].to_list() == ["paper/paper", "paper/paper", "paper/reasoned"]
    assert df["protocols_differ"].to_list() == [False, False, True]
    md = write_comparison(df, tmp_path / "out")["md"].read_text()
    assert "| graph_memory | sample | **paper/reasoned (differs)** |" in md
    assert "| flat | sample | paper/paper |" in md
