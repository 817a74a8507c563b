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

from structmem_gpu.core.runlock import HOLDER_NAME, RunDirBusyError, hold_run_dir

ROOT = Path(__file__).resolve().parents[2]


def _holder_process(run_dir: Path, ready: Path, pose: str = "") -> subprocess.Popen[bytes]:
    """A child process that holds `run_dir` for 60 s (`pose`: code run first, e.g. another
    host's name); returns once it holds it."""
    code = pose + textwrap.dedent(f"""
        import time
        from pathlib import Path
        from structmem_gpu.core.runlock import hold_run_dir
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
    with caplog.at_level(logging.WARNING, logger="structmem_gpu.core.runlock"), hold_run_dir(run_dir):
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


# --- several hosts on a shared file system without locks -----------------------------------

_POSE = """
import errno, fcntl, socket
def _enolck(*a, **k):
    raise OSError(errno.ENOLCK, "No locks available")
fcntl.flock = fcntl.lockf = _enolck
socket.gethostname = lambda: {host!r}
"""


def _other_host_holder(run_dir: Path, ready: Path, host: str) -> subprocess.Popen[bytes]:
    return _holder_process(run_dir, ready, pose=_POSE.format(host=host))


def _no_locks(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    import errno
    import fcntl

    def enolck(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", enolck)
    monkeypatch.setattr(fcntl, "lockf", enolck)
    monkeypatch.setattr(socket, "gethostname", lambda: host)


def test_a_job_on_another_host_is_refused_until_its_heartbeat_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from structmem_gpu.core import runlock

    run_dir = tmp_path / "run"
    proc = _other_host_holder(run_dir, tmp_path / "ready", "node-a")
    _no_locks(monkeypatch, "node-b")
    try:
        with pytest.raises(RunDirBusyError) as err, hold_run_dir(run_dir):
            pytest.fail("a second host got the directory")
        msg = str(err.value)
        assert "\n" not in msg and "in use by another job" in msg
        assert "host node-a" in msg and f"pid {proc.pid}" in msg and "heartbeat" in msg
    finally:
        proc.kill()
        proc.wait()
    # The holder died on node-a: node-b cannot see its pid, so the file stands until its
    # heartbeat is stale ...
    with pytest.raises(RunDirBusyError), hold_run_dir(run_dir):
        pytest.fail("taken over while the heartbeat was fresh")
    # ... and is then taken over, with a warning naming the dead holder.
    monkeypatch.setattr(runlock, "STALE_S", 0.3)
    time.sleep(0.4)
    with caplog.at_level(logging.WARNING, logger="structmem_gpu.core.runlock"), hold_run_dir(run_dir):
        holder = json.loads((run_dir / HOLDER_NAME).read_text())
        assert holder["host"] == "node-b" and holder["pid"] == os.getpid()
    assert any("taking over" in r.getMessage() and "node-a" in r.getMessage()
               for r in caplog.records)
    assert not list(run_dir.glob(f"{HOLDER_NAME}*"))  # no holder, no stale copy left


def test_the_heartbeat_advances_while_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from structmem_gpu.core import runlock

    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.05)
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir):
        first = json.loads((run_dir / HOLDER_NAME).read_text())["heartbeat"]
        deadline = time.monotonic() + 10
        while json.loads((run_dir / HOLDER_NAME).read_text())["heartbeat"] == first:
            assert time.monotonic() < deadline, "heartbeat never rewritten"
            time.sleep(0.02)


def test_a_fresh_holder_of_another_host_with_a_dead_looking_pid_is_respected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / HOLDER_NAME).write_text(json.dumps(
        {"host": "node-a", "pid": 999999, "started": "x", "token": "t", "heartbeat": time.time()}))
    _no_locks(monkeypatch, "node-b")
    with pytest.raises(RunDirBusyError, match="host node-a"), hold_run_dir(run_dir):
        pytest.fail("a live holder on another host was taken over")
