"""Faults on the real stack (each job launches its own llama.cpp server + SmolLM2, MiniLM):
the server SIGKILLed mid-extract is replaced and the run completes; with replacement off the
stage is incomplete (exit 2) and a plain rerun resumes it; SIGTERM mid-extract stops the job
for requeue (exit 75) without a partial table and the rerun resumes.

Kept cheap: sample-1 cut to its first 2 sessions (4 extraction requests), fresh caches so that
there is something to interrupt; only the replacement test runs the later stages (2
consolidation windows, sample-1's questions answered and judged).
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
from structmem_gpu.core.preempt import DEFAULT_EXIT_CODE
from tests.fixtures.llm import cached_replies, llamacpp_missing, register_server_log

pytestmark = [
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["debug=ci", "benchmark=sample", "benchmark.conversations=[sample-1]",
         "benchmark.max_sessions=2", "method=structmem", "llm.progress=false"]




def _server_pid(job_pid: int) -> int | None:
    """The llama.cpp server the job launched (its child, in a session of its own)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == job_pid and "llama_cpp.server" in cmd:
            return int(entry.name)
    return None


class Job:
    """`jobs/run.py` in a subprocess with its own cache and run directory."""

    def __init__(self, tmp_path: Path, *overrides: str) -> None:
        self.run_dir = tmp_path / "run"
        self.cache = tmp_path / "cache"
        self.db = self.cache / "llm" / CACHE_FILE
        self.argv = [sys.executable, str(ROOT / "jobs" / "run.py"), *SMALL, *overrides,
                     f"paths.cache_dir={self.cache}", f"hydra.run.dir={self.run_dir}"]
        register_server_log(self.run_dir / "logs" / "llm.server.log")

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)

    def wait_for_replies(self, proc: subprocess.Popen[str], n: int) -> None:
        deadline = time.monotonic() + 600
        while cached_replies(self.db) < n:
            assert proc.poll() is None, f"job ended early:\n{proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, f"no {n} replies cached within 600 s"
            time.sleep(0.1)

    def extract_rows(self) -> pl.DataFrame:
        return RunDir(self.run_dir).read_table("requests").filter(pl.col("stage") == "extract")


def _kill_server_mid_extract(job: Job) -> tuple[subprocess.Popen[str], str, str]:
    proc = job.start()
    try:
        job.wait_for_replies(proc, 1)
        pid = _server_pid(proc.pid)
        assert pid is not None, "the job's llama.cpp server was not found"
        os.kill(pid, signal.SIGKILL)  # crash / OOM kill of the server, not of the job
        out, err = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc, out, err


@pytest.mark.e2e  # the gate keeps one fault: replacement off, then resumed
def test_server_killed_mid_extract_is_replaced_and_the_run_completes(tmp_path: Path) -> None:
    job = Job(tmp_path, "report.max_parse_failure_rate=1.0")
    proc, out, err = _kill_server_mid_extract(job)
    assert proc.returncode == 0, err[-4000:]
    logged = out + err  # Hydra's console log handler writes to stdout
    assert "server died" in logged and "starting replacement 1/3" in logged
    rows = job.extract_rows()
    # Every request has exactly one row, and every one of them got a reply.
    assert rows["request_id"].n_unique() == rows.height > 0
    assert not rows["unanswered"].any()
    run = RunDir(job.run_dir)
    assert all(run.stage_entry(s)["status"] == "done"  # type: ignore[index]
               for s in ("extract", "consolidate", "answer", "judge", "report"))
    assert (job.run_dir / "report" / "report.json").is_file()


def test_without_replacement_the_stage_is_incomplete_and_a_plain_rerun_resumes(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path, "llm.max_restarts=0", "stages=[load,extract]")
    proc, _, err = _kill_server_mid_extract(job)
    assert proc.returncode == 2, err[-4000:]
    [line] = [ln for ln in err.splitlines() if ln.startswith("error:")]
    entry = RunDir(job.run_dir).stage_entry("extract")
    assert entry is not None and entry["status"] == "incomplete"
    lost, total = entry["unanswered"], entry["requests"]
    assert f"stage 'extract' incomplete: {lost} of {total} requests got no reply from http://127.0.0.1:" in line
    assert 0 < lost < total and not RunDir(job.run_dir).has_table("entries")
    first = job.extract_rows()
    answered_unparsed = first.filter(~pl.col("unanswered") & ~pl.col("parse_ok")).height
    cached = cached_replies(job.db)

    again = job.run()  # the same command: a new server, only what is missing is sent
    assert again.returncode == 0, again.stderr[-4000:]
    rows = job.extract_rows()
    assert rows.height == total and not rows["unanswered"].any()
    assert int(rows["cache_hit"].sum()) == cached
    # Re-sent: the unanswered ones, plus (as always) replies that came back but did not parse,
    # which the cache never stores.
    assert int((~rows["cache_hit"]).sum()) == lost + answered_unparsed


@pytest.mark.e2e  # the gate keeps one fault: replacement off, then resumed
def test_sigterm_mid_extract_exits_for_requeue_and_the_rerun_resumes(tmp_path: Path) -> None:
    job = Job(tmp_path, "stages=[load,extract]", "preempt.grace_s=60")
    proc = job.start()
    try:
        job.wait_for_replies(proc, 1)
        server = _server_pid(proc.pid)
        proc.send_signal(signal.SIGTERM)  # what SLURM sends on preemption
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == DEFAULT_EXIT_CODE, err[-4000:]
    assert "preempted: stage 'extract' stopped by SIGTERM" in err and "Traceback" not in err
    run = RunDir(job.run_dir)
    assert not run.has_table("entries") and run.stage_entry("extract") is None
    assert server is not None and not Path(f"/proc/{server}").exists()  # server stopped too
    cached = cached_replies(job.db)
    assert cached >= 1

    again = job.run()
    assert again.returncode == 0, again.stderr[-4000:]
    rows = job.extract_rows()
    assert int(rows["cache_hit"].sum()) == cached  # everything that landed was kept
    assert int((~rows["cache_hit"]).sum()) == rows.height - cached
    assert run.stage_entry("extract")["status"] == "done"  # type: ignore[index]
