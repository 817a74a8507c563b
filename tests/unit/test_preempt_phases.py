"""A stop signal (SIGTERM / SIGUSR2) ends a job within the preemption grace whatever it is
doing: an encoder load, a server's start-up and readiness wait (structmem_gpu/core/preempt.py
`interruptible`), still exiting 75. Fake slow encoders and servers; no real model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from structmem_gpu.core import preempt
from structmem_gpu.llm.server import launch_server

ROOT = Path(__file__).resolve().parents[2]


def _signal_soon(sig: int = signal.SIGTERM, after_s: float = 0.3) -> None:
    """Send `sig` to this process from another thread (the handler runs in the main thread)."""
    threading.Timer(after_s, os.kill, (os.getpid(), sig)).start()


@pytest.fixture(autouse=True)
def _clean() -> None:
    preempt.reset()
    yield
    preempt.reset()


def test_a_signal_inside_a_phase_raises_at_once_through_except_exception() -> None:
    swallowed: list[BaseException] = []
    t0 = time.monotonic()
    with preempt.PreemptionGuard(grace_s=5):
        _signal_soon(signal.SIGUSR2)
        with pytest.raises(preempt.Preempted, match="^encoder load stopped by SIGUSR2"):
            with preempt.interruptible("encoder load"):
                while time.monotonic() - t0 < 10:  # a loader with a broad fallback
                    try:
                        time.sleep(0.05)
                    except Exception as exc:  # noqa: BLE001 - what a library may do
                        swallowed.append(exc)
    assert time.monotonic() - t0 < 2 and swallowed == []
    assert preempt.signal_name() == "SIGUSR2"


def test_outside_a_phase_the_signal_only_asks_to_stop_and_a_phase_then_refuses() -> None:
    with preempt.PreemptionGuard(grace_s=5):
        os.kill(os.getpid(), signal.SIGTERM)  # handled before kill() returns: no exception
        assert preempt.requested()
        with pytest.raises(preempt.Preempted, match="^llm server start-up stopped by SIGTERM"):
            with preempt.interruptible("llm server start-up"):
                pytest.fail("a phase entered after the signal must not run")


def test_a_server_that_never_gets_ready_is_stopped_by_the_signal(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    t0 = time.monotonic()
    with preempt.PreemptionGuard(grace_s=5):
        _signal_soon(after_s=1.0)
        with pytest.raises(preempt.Preempted, match="^llm server start-up stopped by SIGTERM"):
            with launch_server(lambda port: [sys.executable, "-c", code], ready_path="/health",
                               log_dir=tmp_path, name="llm", startup_timeout_s=300):
                pytest.fail("never ready")
    assert time.monotonic() - t0 < 8
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped (and reaped) on the way out


# ---- whole jobs, signalled from outside ----------------------------------------------------


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    (tmp / "hf").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp / "hf"), HF_HUB_OFFLINE="1", **extra)
    return env


def _stop_when(marker: Path, cmd: list[str], env: dict[str, str], grace_s: float
               ) -> tuple[int, float, str]:
    """Start the job, SIGTERM it once `marker` exists; (exit code, seconds after the signal,
    output)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the job never reached the slow phase"
            time.sleep(0.1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=grace_s + 30)
        return proc.returncode, time.monotonic() - t0, out
    finally:
        if proc.poll() is None:
            proc.kill()


def _job(tmp: Path, *overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "jobs" / "run.py"), *overrides, "benchmark.max_sessions=1",
            "preempt.grace_s=5", f"paths.output_dir={tmp / 'out'}", f"paths.cache_dir={tmp / 'cache'}"]


@pytest.mark.e2e  # e2e: job subprocesses
def test_sigterm_during_the_encoder_load_exits_75_within_the_grace(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "sentence_transformers"
    fake.mkdir(parents=True)
    marker = tmp_path / "loading"
    (fake / "__init__.py").write_text(textwrap.dedent(f"""
        # A slow encoder load (sentence-transformers stand-in) that swallows ordinary errors.
        import time
        class SentenceTransformer:
            def __init__(self, *args, **kwargs):
                open({str(marker)!r}, "w").write("loading")
                while True:
                    try:
                        time.sleep(0.1)
                    except Exception as exc:
                        print("swallowed", exc)
        """))
    env = _env(tmp_path, PYTHONPATH=str(fake.parent))
    code, took, out = _stop_when(marker, _job(tmp_path, "debug=scripted", "embedder=minilm"), env, 5)
    assert code == 75, out[-3000:]
    assert took < 5, took
    assert "preempted: encoder load stopped by SIGTERM" in out and "swallowed" not in out
    assert "Traceback" not in out


def test_sigterm_during_server_start_up_exits_75_and_stops_the_server(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("w")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "server.pid"
    (bin_dir / "vllm").write_text(f"#!/bin/sh\necho $$ > {marker}\nexec sleep 600\n")
    (bin_dir / "vllm").chmod(0o755)
    env = _env(tmp_path, PATH=f"{bin_dir}:/usr/bin:/bin")
    cmd = _job(tmp_path, "llm=vllm_server", f"llm.model={model}", "llm.served_name=fake",
               "embedder=minilm", "extract.window_tokenizer=chars")  # the fake folder has none
    code, took, out = _stop_when(marker, cmd, env, 5)
    assert code == 75, out[-3000:]
    assert took < 5, took
    assert "preempted: llm server start-up stopped by SIGTERM" in out and "Traceback" not in out
    with pytest.raises(ProcessLookupError):
        os.kill(int(marker.read_text()), 0)  # the fake server is gone


def test_a_phase_in_another_thread_leaves_the_main_thread_alone() -> None:
    """Only the main thread's phases make the handler raise (it runs in the main thread)."""
    entered, release = threading.Event(), threading.Event()

    def worker() -> None:
        with preempt.interruptible("worker load"):
            entered.set()
            release.wait(5)

    t = threading.Thread(target=worker)
    with preempt.PreemptionGuard(grace_s=5):
        t.start()
        assert entered.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)  # must not raise here, outside any main phase
        assert preempt.requested()
        release.set()
        t.join(5)
    with pytest.raises(preempt.Preempted):
        preempt.check_phase("worker load")
