"""analysis/compare.py: one row per run from report.json + manifest.json; md/csv/json output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from jobs.report import main as report_main
from structmem_gpu.core.errors import InputError
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
    assert "| graph_memory | sample | – | same_as_llm | not audited | reasoned/reasoned | 4 | 50.0 [10.0, 90.0] |" in md
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
    assert "| graph_memory | sample | – | same_as_llm | not audited | **paper/reasoned (differs)** |" in md
    assert "| flat | sample | – | same_as_llm | not audited | paper/paper |" in md


def _launched(run: Path, overrides: list[str], model: str = "Qwen/Qwen2.5-7B-Instruct") -> Path:
    """Give a fake run the .hydra/ record jobs/run.py writes."""
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / ".hydra" / "config.yaml").write_text(f"llm:\n  model: {model}\n  served_name: null\n")
    return run


def test_a_sweep_is_labelled_by_its_varied_key_and_sorted_numerically(tmp_path: Path) -> None:
    runs = []
    for k in (100, 20, 10, 60, 40, 80):  # discovery order is by path: 10, 100, 20, ...
        run = fake_run(tmp_path / f"retrieve.entries_k={k}", "structmem", {"extract": _cost(8)},
                       acc=k / 200)
        runs.append(_launched(run, ["experiment=entries_k_sweep", f"retrieve.entries_k={k}",
                                    f"paths.cache_dir=/c{k}", "llm=vllm_qwen2_5_7b"]))
    df = compare_runs(discover_runs(tmp_path))
    assert df.columns[0] == "retrieve.entries_k"  # the varied key leads; constant ones do not show
    assert "experiment" not in df.columns and "paths.cache_dir" not in df.columns
    assert df["retrieve.entries_k"].to_list() == [10, 20, 40, 60, 80, 100]
    assert df["acc_overall"].to_list() == [0.05, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert set(df["answer_model"]) == {"Qwen2.5-7B-Instruct"}
    paths = write_comparison(df, tmp_path / "out")
    md = paths["md"].read_text()
    assert "| entries_k | method | benchmark | answer model | judge |" in md
    rows = [l for l in md.splitlines() if l.startswith("| ") and "structmem |" in l]
    assert [r.split(" | ")[0].strip("| ") for r in rows[:6]] == ["10", "20", "40", "60", "80", "100"]
    assert "| 10 | structmem | sample | Qwen2.5-7B-Instruct | same_as_llm | not audited | reasoned/reasoned | 4 | 5.0 [10.0, 90.0] |" in md
    assert pl.read_csv(paths["csv"])["retrieve.entries_k"].to_list() == [10, 20, 40, 60, 80, 100]
    assert [r["retrieve.entries_k"] for r in json.loads(paths["json"].read_text())][:2] == [10, 20]


def test_two_varied_keys_and_mixed_values(tmp_path: Path) -> None:
    runs = [
        _launched(fake_run(tmp_path / "a", "structmem", {"extract": _cost(8)}),
                  ["consolidate.seed_k=5", "llm=vllm_qwen3_8b"], model="Qwen/Qwen3-8B"),
        _launched(fake_run(tmp_path / "b", "structmem", {"extract": _cost(8)}),
                  ["consolidate.seed_k=0", "llm=vllm_qwen2_5_7b"]),
        _launched(fake_run(tmp_path / "c", "structmem", {"extract": _cost(8)}), ["llm=vllm_qwen2_5_7b"]),
    ]
    df = compare_runs(runs)
    assert df.columns[:2] == ["consolidate.seed_k", "llm"]
    assert df["consolidate.seed_k"].to_list() == [0, 5, None]  # a run without the key sorts last
    assert df["answer_model"].to_list() == ["Qwen2.5-7B-Instruct", "Qwen3-8B", "Qwen2.5-7B-Instruct"]
    md = write_comparison(df, tmp_path / "out")["md"].read_text()
    assert "| seed_k | llm | method |" in md and "| – | vllm_qwen2_5_7b | structmem |" in md


def test_the_published_row_that_matched_is_shown(tmp_path: Path) -> None:
    from structmem_gpu.eval.published import load_published

    row = next(r for r in load_published() if "judge_accuracy" in r.overall)
    run = fake_run(tmp_path, "structmem", {"extract": _cost(8)})
    rep = json.loads((run / "report" / "report.json").read_text())
    (run / "report" / "report.json").write_text(json.dumps({**rep, "published": [row.id]}))
    df = compare_runs([run])
    assert df["published_id"].to_list() == [row.id]
    assert df["published_acc"].to_list() == [pytest.approx(row.overall["judge_accuracy"] / 100)]
    md = write_comparison(df, tmp_path / "out")["md"].read_text()
    # a row whose J covers category 5 (SEEM's) says so beside its number
    note = " (includes category 5)" if 5 in row.categories else ""
    assert f"| {row.overall['judge_accuracy']:.1f}{note} |" in md


def test_a_published_row_matched_beside_its_configuration_shows_its_note(tmp_path: Path) -> None:
    # experiment=structmem_locomo (paper text) gets Table 1 with the note; the reference-code
    # configuration (the one that produced 76.82) gets it without
    note = "paper text configuration, number from the code's"
    runs = []
    for name, notes in (("text", {"structmem-table1": note}), ("code", {})):
        run = fake_run(tmp_path / name, "structmem", {"extract": _cost(8)})
        rep = json.loads((run / "report" / "report.json").read_text())
        rep.update(published=["structmem-table1"], published_notes=notes)
        (run / "report" / "report.json").write_text(json.dumps(rep))
        runs.append(run)
    df = compare_runs(runs)
    assert sorted(df["published_note"].to_list(), key=str) == sorted([note, None], key=str)
    md = write_comparison(df, tmp_path / "out")["md"].read_text()
    assert f"| 76.8 ({note}) |" in md and "| 76.8 |" in md
