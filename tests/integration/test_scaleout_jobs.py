"""Scale-out on the real stack (llama.cpp + SmolLM2, MiniLM): a submitit_local multirun that
reuses a warmed cache, and a job SIGKILLed during extraction that resumes.

Kept cheap: sample-1 cut to its first 2 sessions (4 extraction requests, 2 consolidation
windows), every job attached to the session's llama.cpp server. Uncached requests: the warm-up
(0 when the session cache already holds sample-1's extraction replies), 2 consolidation
requests per seed_k value not seen before, and the 4 extraction requests of the kill test
(fresh cache, so there is something to kill) plus at most the 2 that were in flight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.llm.cache import CACHE_FILE
from structmem_gpu.run.merge import discover_run_dirs
from tests.fixtures.llm import LlamaServer, cached_replies, llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["benchmark=sample", "benchmark.conversations=[sample-1]", "benchmark.max_sessions=2",
         "method=structmem"]
MAX_IN_FLIGHT = 2  # conf/llm/llamacpp_cpu.yaml: requests a killed job can leave on the server


def job(*overrides: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "run.py"), *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (
        f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def extract_rows(run_dir: Path) -> pl.DataFrame:
    return RunDir(run_dir).read_table("requests").filter(pl.col("stage") == "extract")


def sorted_rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns)


@pytest.fixture(scope="module")
def warm_run(tmp_path_factory: pytest.TempPathFactory, ci_overrides: list[str]) -> Path:
    """stages=[load,extract,embed] once on the session cache: the uninterrupted reference run,
    and the warm-up after which sweep jobs find every extraction reply and embedding cached."""
    run_dir = tmp_path_factory.mktemp("scaleout-warm")
    run_pipeline([*ci_overrides, *SMALL, "stages=[load,extract,embed]"], run_dir)
    return run_dir


def test_local_multirun_reuses_the_warm_cache(warm_run: Path, ci_overrides: list[str],
                                              llama_server: LlamaServer, tmp_path: Path) -> None:
    n_extract = extract_rows(warm_run).height
    sweep = tmp_path / "sweep"
    job("-m", "hydra/launcher=local", "hydra.launcher.timeout_min=30", *ci_overrides, *SMALL,
        "consolidate.seed_k=0,5", "stages=[load,extract,embed,consolidate]", f"hydra.sweep.dir={sweep}")
    runs = discover_run_dirs([sweep])
    assert len(runs) == 2, runs
    seen = set()
    for run_dir in runs:
        run = RunDir(run_dir)
        rows = extract_rows(run_dir)
        assert rows.height == n_extract and rows["cache_hit"].all(), f"{run_dir}: extraction re-sent"
        assert rows["attempts"].sum() == 0
        embed = run.stage_entry("embed")
        assert embed is not None and embed["notes"]["embedded_new"] == 0, f"{run_dir}: re-embedded"
        consolidate = run.stage_entry("consolidate")
        assert consolidate is not None and consolidate["status"] == "done"
        seen.add(consolidate["config"]["consolidate"]["seed_k"])
        assert run.read_table("syntheses").height > 0
        assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert seen == {0, 5}
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit




def test_sigkill_during_extract_then_rerun_resumes(warm_run: Path, ci_overrides: list[str],
                                                   llama_server: LlamaServer, tmp_path: Path) -> None:
    # A fresh cache, so that extraction really goes to the server and can be interrupted.
    cache = tmp_path / "cache"
    overrides = [o for o in ci_overrides if not o.startswith("paths.cache_dir=")]
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *overrides, f"paths.cache_dir={cache}",
           *SMALL, "stages=[load,extract]", f"hydra.run.dir={tmp_path / 'run'}"]
    db = cache / "llm" / CACHE_FILE
    n_total = extract_rows(warm_run).height
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while cached_replies(db) < 2:
            assert proc.poll() is None, f"job ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no extraction reply cached within 600 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-batch: no finally, no manifest entry
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    killed = RunDir(tmp_path / "run")
    assert killed.stage_entry("extract") is None and not killed.has_table("entries")
    done_before_kill = cached_replies(db)
    assert 2 <= done_before_kill < n_total, "the kill did not land mid-batch"

    before = llama_server.calls()
    job(*cmd[2:])  # the same command again
    rows = extract_rows(tmp_path / "run")
    assert rows.height == n_total
    # Every reply that was finished before the kill came from the cache; only the rest was sent.
    assert int(rows["cache_hit"].sum()) == done_before_kill
    sent = rows.filter(~pl.col("cache_hit"))
    assert sent.height == n_total - done_before_kill
    delta = llama_server.calls() - before
    attempts = int(sent["attempts"].sum())
    # The killed job's in-flight requests may still be answered by the server meanwhile.
    assert attempts <= delta <= attempts + MAX_IN_FLIGHT, (delta, attempts)

    resumed = RunDir(tmp_path / "run").read_table("entries")
    # Same tables as an uninterrupted run over the same replies (served from the cache: no calls)...
    before = llama_server.calls()
    job(*cmd[2:-1], f"hydra.run.dir={tmp_path / 'again'}")
    assert llama_server.calls() == before
    again = RunDir(tmp_path / "again").read_table("entries")
    assert sorted_rows(resumed).equals(sorted_rows(again))
    # ...and as the uninterrupted reference run computed by the server independently.
    reference = RunDir(warm_run).read_table("entries")
    assert sorted_rows(resumed).equals(sorted_rows(reference))
