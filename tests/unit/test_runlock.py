"""One job per run directory: a second job is refused naming the holder; a dead holder's lock
is taken over with a warning."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from structmem_gpu.runlock import HOLDER_NAME, RunDirBusyError, hold_run_dir

ROOT = Path(__file__).resolve().parents[2]


def _holder_process(run_dir: Path, ready: Path) -> subprocess.Popen[bytes]:
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from structmem_gpu.runlock import hold_run_dir
        with hold_run_dir(Path({str(run_dir)!r})):
            Path({str(ready)!r}).write_text("held")
            time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "holder did not start"
        time.sleep(0.05)
    return proc


def test_second_holder_is_refused_with_the_holder_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _holder_process(run_dir, tmp_path / "ready")
    try:
        with pytest.raises(RunDirBusyError) as err, hold_run_dir(run_dir):
            pytest.fail("a second holder got the lock")
        msg = str(err.value)
        assert str(run_dir) in msg and f"pid {proc.pid}" in msg
        assert f"host {socket.gethostname()}" in msg and "started 20" in msg
    finally:
        proc.kill()
        proc.wait()
    # The kernel dropped the SIGKILLed holder's lock: the directory is free again, and the
    # holder file it left behind is reported as taken over.
    with hold_run_dir(run_dir):
        holder = json.loads((run_dir / HOLDER_NAME).read_text())
        assert holder["pid"] == os.getpid()
    assert not (run_dir / HOLDER_NAME).exists()  # a clean exit removes our holder file


def test_stale_holder_file_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is gone now
    stale = {"host": socket.gethostname(), "pid": dead.pid, "started": "2026-01-01T00:00:00"}
    (run_dir / HOLDER_NAME).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING, logger="structmem_gpu.runlock"), hold_run_dir(run_dir):
        pass
    lines = [r.getMessage() for r in caplog.records]
    assert any("taking over" in m and f"pid {dead.pid}" in m for m in lines), lines


def test_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError), hold_run_dir(run_dir):
        raise ValueError("stage crashed")
    with hold_run_dir(run_dir):  # free again
        pass


def test_second_job_on_a_busy_run_dir_exits_2_naming_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _holder_process(run_dir, tmp_path / "ready")
    try:
        job = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "run.py"), "debug=scripted",
             f"hydra.run.dir={run_dir}", f"paths.cache_dir={tmp_path / 'cache'}", "force=true"],
            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        holder.kill()
        holder.wait()
    assert job.returncode == 2, job.stderr[-2000:]
    errors = [ln for ln in job.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"pid {holder.pid}" in errors[0] and "in use" in errors[0]
    assert "Traceback" not in job.stderr
    assert not (run_dir / "tables").exists()  # it wrote nothing, not even Hydra's record
    assert not (run_dir / ".hydra").exists() and not (run_dir / "manifest.json").exists()
