"""Sweeps a researcher can trust: one configuration per run directory, failed points named at
once and in a closing summary, a headline table at the end of every job (jobs/run.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# e2e: every test here launches jobs/run.py multiruns as subprocesses
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["debug=scripted", "embedder=minilm", "benchmark.max_sessions=3"]


def exploding_builder(*args: object, **kwargs: object) -> object:
    """An `answer.prompt` context builder with a bug (the test's unexpected exception)."""
    raise RuntimeError("boom in a user context builder")


def job(tmp: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *overrides,
           f"paths.output_dir={tmp / 'out'}", f"paths.cache_dir={tmp / 'cache'}"]
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sweeps")


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_two_configurations_two_directories_and_each_resumes(tmp: Path) -> None:
    a = job(tmp, *SMALL)
    b = job(tmp, *SMALL, "consolidate.seed_k=5")
    assert a.returncode == 0 and b.returncode == 0, a.stdout[-2000:] + b.stdout[-2000:]
    base = tmp / "out" / "runs" / "sample" / "structmem"
    run_a = base / "benchmark.max_sessions=3,debug=scripted,embedder=minilm"
    run_b = base / "benchmark.max_sessions=3,consolidate.seed_k=5,debug=scripted,embedder=minilm"
    assert (run_a / "report" / "report.json").is_file() and (run_b / "report" / "report.json").is_file()
    assert _manifest(run_a)["stages"]["consolidate"]["config"]["consolidate"]["seed_k"] == 15
    assert _manifest(run_b)["stages"]["consolidate"]["config"]["consolidate"]["seed_k"] == 5
    # The closing table: headline scores with CI, then the paths.
    assert "| overall | " in a.stdout and "95% CI" in a.stdout and f"report: {run_a}" in a.stdout
    assert f"page: {run_a / 'report' / 'index.html'}" in a.stdout  # the run's HTML page
    again = job(tmp, *SMALL, "consolidate.seed_k=5")
    assert again.returncode == 0
    stages = _manifest(run_b)["stages"]
    assert again.stdout.count("skipped (finished, same fingerprint") == len(stages)
    assert "running" not in "".join(l for l in again.stdout.splitlines() if "stage " in l)


def test_a_shared_directory_logs_changed_keys_and_replaced_stages(tmp: Path) -> None:
    shared = tmp / "shared"
    first = job(tmp, *SMALL, f"hydra.run.dir={shared}")
    assert first.returncode == 0, first.stdout[-2000:]
    assert "held another configuration" not in first.stdout
    second = job(tmp, *SMALL, f"hydra.run.dir={shared}", "consolidate.seed_k=5")
    assert second.returncode == 0, second.stdout[-2000:]
    line = next(l for l in second.stdout.splitlines() if "held another configuration" in l)
    assert "1 key changed (consolidate.seed_k: 15 -> 5)" in line
    assert line.endswith("replaces the tables of stages consolidate, retrieve, answer, judge, report")
    assert line and second.stdout.index(line) < second.stdout.index("stage consolidate  running")


def test_a_failing_point_is_named_at_once_and_the_sweep_goes_on(tmp: Path) -> None:
    sweep = tmp / "sweep"
    proc = job(tmp, "-m", *SMALL, f"hydra.sweep.dir={sweep}", "retrieve.entries_k=5,-5,10")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    bad = "error: config retrieve.entries_k=-5: expected an integer >= 0 (0 = off)"
    assert bad in out and out.index(bad) < out.index("#2 :")  # printed before the next point
    assert "Traceback" not in out
    summary = (sweep / "sweep_summary.md").read_text()
    assert "3 points, 2 ok, 1 not ok" in summary and bad.removeprefix("error: ") in summary
    assert "# Sweep summary: 3 points, 2 ok, 1 not ok" in out  # printed at the end too
    points = json.loads((sweep / "sweep_summary.json").read_text())
    assert [p["status"] for p in points] == ["ok", "failed", "ok"]
    assert [p["exit_code"] for p in points] == [0, 2, 0]
    for p in (points[0], points[2]):
        assert Path(p["report"]).is_file()
    assert points[1]["report"] is None


def test_an_unexpected_exception_fails_its_point_with_its_traceback_in_run_log(tmp: Path) -> None:
    sweep = tmp / "sweep_bug"
    builder = "tests.unit.test_sweeps:exploding_builder"
    proc = job(tmp, "-m", *SMALL, "method=full_context", "stages=[load,answer]",
               f"hydra.sweep.dir={sweep}",
               f"answer.prompt={builder},structmem_gpu.methods.baselines.full_context:build_prompts")
    assert proc.returncode == 1, proc.stdout[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("error: RuntimeError"))
    assert "boom in a user context builder" in line and "run.log" in line
    points = json.loads((sweep / "sweep_summary.json").read_text())
    assert [p["status"] for p in points] == ["failed", "ok"]
    run_log = Path(points[0]["run_dir"]) / "run.log"
    assert "Traceback" in run_log.read_text() and "exploding_builder" in run_log.read_text()


def test_a_single_job_keeps_exit_code_2_for_expected_errors(tmp: Path) -> None:
    proc = job(tmp, *SMALL, "retrieve.entries_k=-1")
    assert proc.returncode == 2
    assert "error: config retrieve.entries_k=-1" in proc.stdout and "Traceback" not in proc.stdout


def test_submitit_points_report_through_their_records(tmp: Path) -> None:
    """hydra/launcher=local (submitit, as on SLURM): each point runs in its own process and
    its record reaches the summary in the launching process."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp / "sweep_submitit"
    proc = job(tmp, "-m", "hydra/launcher=local", *SMALL, "stages=[load]",
               f"hydra.sweep.dir={sweep}", "retrieve.entries_k=5,-5")
    assert proc.returncode == 1, proc.stdout[-3000:]
    points = json.loads((sweep / "sweep_summary.json").read_text())
    assert [(p["job"], p["status"]) for p in points] == [(0, "ok"), (1, "failed")]
    assert "retrieve.entries_k=-5: expected an integer >= 0" in points[1]["error"]
    assert "# Sweep summary: 2 points, 1 ok, 1 not ok" in proc.stdout
