"""StructMem's Table 1 as a table (analysis/table1.py, `jobs/report.py table1`): scripted runs of
our methods on the bundled sample, each put beside the paper's row of its method, with the
paper's scores and build cost, ours from the same accounting, and the paired test against
StructMem. The baseline systems' runs go through the same code in the systems tier
(tests/systems/test_system_runs.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from structmem_gpu.analysis.table1 import build_cost, render_markdown, table1, table1_rows
from structmem_gpu.core.errors import InputError
from tests.fixtures.pipeline import compose_cfg, load_job
from tests.unit.test_inspect import build_scripted_run


def _run(factory: pytest.TempPathFactory, base: Path, method: str) -> Path:
    """A copy of the session's scripted run of `method` on the sample (test_inspect builds it
    once for every module), with its configuration saved where Hydra saves a launched job's
    (.hydra/config.yaml: what table1 reads to place a run)."""
    run_dir = base / method
    shutil.copytree(build_scripted_run(factory, method), run_dir)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    overrides = ["debug=scripted", "benchmark=sample", f"method={method}"]
    OmegaConf.save(compose_cfg(overrides), run_dir / ".hydra" / "config.yaml")
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("table1")
    return [_run(tmp_path_factory, base, "structmem"), _run(tmp_path_factory, base, "full_context")]


def _by_label(df) -> dict[str, dict]:
    return {r["label"]: r for r in df.iter_rows(named=True)}


def test_every_table1_row_is_listed_with_the_papers_numbers(runs: list[Path]) -> None:
    df = table1(runs)
    rows = table1_rows()
    assert [r for r in df["row"].to_list() if r] == [r.id for r in rows]
    sm = _by_label(df)["StructMem"]
    assert sm["paper_overall"] == 76.82 and sm["paper_calls"] == 1056
    assert sm["paper_multi-hop"] == 68.77 and sm["paper_temporal"] == 81.62
    assert sm["paper_prompt_tokens"] == 1_501_000


def test_a_run_stands_beside_its_methods_row_with_the_reason_it_is_not_the_paper(
        runs: list[Path]) -> None:
    sm = _by_label(table1(runs))["StructMem"]
    assert sm["run_dir"] == str(runs[0]) and sm["matched"] is False
    assert sm["status"].startswith("not the paper's configuration: harness run: llm=scripted")
    assert sm["vs_structmem"] == "reference"


def test_build_cost_is_the_building_stages_only(runs: list[Path]) -> None:
    manifest = json.loads((runs[0] / "manifest.json").read_text())
    stages = manifest["stages"]
    built = sum(stages[s]["build_cost"]["calls"] for s in ("extract", "consolidate", "update")
                if s in stages and stages[s].get("build_cost"))
    cost = build_cost(manifest, runs[0])
    assert cost["calls"] == built > 0
    everything = sum((e.get("build_cost") or {}).get("calls", 0) for e in stages.values())
    assert everything > built  # answer and judge calls exist and are left out
    sm = _by_label(table1(runs))["StructMem"]
    assert sm["ours_calls"] == built and sm["ours_prompt_tokens"] > 0


def test_another_method_is_paired_against_structmem(runs: list[Path]) -> None:
    df = table1(runs)
    fc = next(r for r in df.iter_rows(named=True) if r.get("run_dir") == str(runs[1]))
    assert fc["vs_structmem"] == "paired" and 0 <= fc["mcnemar_p"] <= 1
    assert fc["ours_calls"] == 0  # no memory: nothing built


def test_a_method_with_two_rows_goes_to_the_one_its_settings_agree_with(runs: list[Path]) -> None:
    """method=full_context stands for two rows: FullContext (sessions newest first, the
    default) and OpenAI (answer.history_order=flat); the run goes to the first, the second is
    listed as not run, and Memobase as excluded with its reason."""
    rows = {r["row"]: r for r in table1(runs).iter_rows(named=True)}
    assert rows["structmem-table1-full-context"]["run_dir"] == str(runs[1])
    assert rows["structmem-table1-openai"]["status"].startswith("not run")
    assert rows["structmem-table1-openai"]["run_dir"] is None
    assert rows["structmem-table1-memobase"]["status"].startswith("excluded: ")
    assert "hosted server" in rows["structmem-table1-memobase"]["status"]


def test_markdown_shows_ours_beside_the_paper_and_the_build_cost(runs: list[Path]) -> None:
    text = render_markdown(table1(runs))
    line = next(s for s in text.splitlines() if s.startswith("| StructMem |"))
    assert "/ 76.82" in line and "reference" in line
    cost = [s for s in text.splitlines() if s.startswith("| StructMem |")][1]
    assert "/ 1.501" in cost and "/ 1.937" in cost and "/ 1,056" in cost and "/ 22,854" in cost
    memoryos = [s for s in text.splitlines() if s.startswith("| MemoryOS |")][1]
    assert "/ 2.868" in memoryos  # the paper's sum as printed (its parts add to 2.828)


def test_the_cli_writes_the_table_and_its_page(runs: list[Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sweep"
    for i, d in enumerate(runs):  # a multirun folder holding the runs
        shutil.copytree(d, sweep / str(i))
    report = load_job("report")
    assert report.main(["table1", str(tmp_path / "out"), str(sweep)]) == 0
    out = tmp_path / "out"
    assert {"table1.md", "table1.csv", "table1.json", "index.html"} <= {p.name for p in out.iterdir()}
    html = (out / "index.html").read_text()
    assert "76.82" in html and "StructMem Table 1" in html
    assert "# StructMem Table 1" in capsys.readouterr().out


def test_no_runs_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no run directories"):
        table1([])
    with pytest.raises(InputError, match="report.json"):
        table1([tmp_path])
