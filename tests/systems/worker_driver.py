"""Driving one baseline system's worker (structmem_gpu/systems/workers/<system>_worker.py) from
a test: the system's own environment (and a skip marker without it), a deterministic encoder,
the worker process speaking the JSON-lines protocol (systems/protocol.py) with the offline
environment a job gives it (stages.worker_env), and our recording front over the system's
scripted replies.

    pytestmark = [pytest.mark.systems, needs_env("lightrag")]

    with WorkerProcess(SPEC, tmp_path, "a", clock=CLOCK) as w, front(SPEC) as f:
        assert w.hello(top_k=10)["op"] == "ready"
        built = w.ask(request(SPEC, "build", f, tmp_path / "store", sessions=SESSIONS))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import select
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

import numpy as np
import pytest

from structmem_gpu.systems import envs
from structmem_gpu.systems.front import RecordingFront, ScriptedUpstream
from structmem_gpu.systems.protocol import unit_url
from structmem_gpu.systems.registry import system_spec
from structmem_gpu.systems.spec import SystemSpec
from structmem_gpu.systems.stages import worker_env

ROOT = Path(__file__).resolve().parents[2]
DIMS = 16
UNIT = "conv-t"
SPEAKERS = ["Caroline", "Melanie"]
# The worker tests' conversation: six turns (support group, painting, adoption), LoCoMo-like
CONVERSATION = [
    ("Caroline", "I went to a LGBTQ support group yesterday and it was powerful."),
    ("Melanie", "That sounds brave! I painted a sunrise over the lake last week."),
    ("Caroline", "Lovely! I am researching adoption agencies in Boston."),
    ("Melanie", "Adoption is wonderful. I ran a charity race for mental health."),
    ("Caroline", "The support group made me feel accepted and hopeful."),
    ("Melanie", "My kids loved the painting of the lake sunrise."),
]

Reply = Callable[[Mapping[str, Any]], dict[str, Any]]


# --- the system's environment ---------------------------------------------------------------

def systems_dir() -> Path:
    # conf/paths/default.yaml: systems_dir = STRUCTMEM_SYSTEMS_DIR, else <root>/.systems
    return Path(os.environ.get("STRUCTMEM_SYSTEMS_DIR") or ROOT / ".systems")


def official_dir() -> str:
    """The official checkouts (STRUCTMEM_OFFICIAL_DIR; "" when unset)."""
    return os.environ.get("STRUCTMEM_OFFICIAL_DIR", "")


def _spec(system: str | SystemSpec) -> SystemSpec:
    return system if isinstance(system, SystemSpec) else system_spec(system)


def system_python(name: str | SystemSpec) -> Path:
    """`$STRUCTMEM_SYSTEMS_DIR/<env>/bin/python` of system `name` (there or not)."""
    return envs.env_python(_spec(name), systems_dir())


def missing_env(name: str | SystemSpec) -> str | None:
    """Why system `name`'s worker cannot start here (None: its environment is there)."""
    spec = _spec(name)
    python = system_python(spec)
    install = f"`python jobs/data.py systems install {spec.env_name}`"
    if spec.repository is not None:
        install += " with STRUCTMEM_OFFICIAL_DIR pointing at the official checkouts"
    if not python.exists():
        return f"no {spec.env_name} environment at {python} (set STRUCTMEM_SYSTEMS_DIR; {install})"
    if spec.repository is not None:
        src = envs.source_dir(spec, systems_dir())
        if not src.is_dir() or not any(src.iterdir()):
            return f"no exported {spec.repository[0]} code at {src} ({install})"
    return None


def needs_env(name: str | SystemSpec) -> pytest.MarkDecorator:
    """Skip unless system `name`'s environment is installed (the reason says how)."""
    why = missing_env(name)
    return pytest.mark.skipif(why is not None, reason=why or "")


def needs_official(folder: str, why: str) -> pytest.MarkDecorator:
    """Skip unless `$STRUCTMEM_OFFICIAL_DIR/<folder>` is there (`why`: what reads it)."""
    there = (Path(official_dir()) / folder).exists() if official_dir() else False
    return pytest.mark.skipif(
        not there, reason=f"STRUCTMEM_OFFICIAL_DIR holds no {folder}: {why} "
                          "(python jobs/data.py official)")


# --- payloads ---------------------------------------------------------------------------------

def session(index: int, time: str, turns: Sequence[tuple[str, str]],
            prefix: str = "u") -> dict[str, Any]:
    """A protocol session; turn i's event id is `<prefix>:D<index>:<i + 1>`."""
    return {"session_index": index, "session_time": time,
            "turns": [{"event_id": f"{prefix}:D{index}:{i + 1}", "speaker": who, "text": text}
                      for i, (who, text) in enumerate(turns)]}


def request(system: str | SystemSpec, op: str, front: RecordingFront, store: Path, *,
            unit: str = UNIT, dims: int = DIMS, **more: Any) -> dict[str, Any]:
    """A build or search request for `unit` whose calls go to `front`."""
    name = _spec(system).name
    return {"op": op, "unit": unit, "base_url": unit_url(front.url, name, op, unit),
            "model": "scripted", "embed_model": f"hash-{dims}", "embed_dims": dims,
            "store_dir": str(store), "speakers": SPEAKERS, **more}


# --- the encoder and the front ----------------------------------------------------------------

def word_vectors(texts: Sequence[str], dims: int = DIMS) -> np.ndarray:
    """Deterministic bag-of-words vectors (each word hashed to one of `dims` buckets), unit
    length: texts that share words are close (LightRAG's cosine threshold lets them through)."""
    m = np.zeros((len(texts), dims), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"\w+", str(text).lower()):
            m[i, hashlib.sha256(word.encode()).digest()[0] % dims] += 1.0
    m[:, 0] += 1e-3  # no zero vector
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def text_vectors(texts: Sequence[str], dims: int = DIMS) -> np.ndarray:
    """Deterministic vectors of whole texts (sha256 bytes): two texts' vectors are alike only
    when the texts are the same (HippoRAG 2's graph search wants its nodes told apart)."""
    return np.asarray([[b / 255.0 - 0.5 for b in hashlib.sha256(str(t).encode()).digest()[:dims]]
                       for t in texts], dtype=np.float32)


Encoder = Callable[[Sequence[str], int], np.ndarray]


class Front(RecordingFront):
    """Our front over scripted replies, keeping every chat and embeddings body as sent."""

    def __init__(self, reply: Reply, dims: int = DIMS, stage: str = "",
                 encoder: Encoder = word_vectors) -> None:
        super().__init__(ScriptedUpstream(reply), embed=lambda t: encoder(t, dims),
                         stage=stage)
        self.chat_bodies: list[bytes] = []
        self.embedding_bodies: list[bytes] = []

    def handle(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        path_only = path.split("?", 1)[0]
        kept = (self.chat_bodies if path_only.endswith("/chat/completions") else
                self.embedding_bodies if path_only.endswith("/embeddings") else None)
        if kept is not None:
            with self._lock:
                kept.append(raw)
        return super().handle(path, raw)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def front(spec_or_reply: SystemSpec | Reply, dims: int = DIMS,
          encoder: Encoder = word_vectors) -> Iterator[Front]:
    """A running Front over a system's scripted replies (its spec) or over `reply`, encoding
    with `encoder` (word_vectors, or text_vectors)."""
    if isinstance(spec_or_reply, SystemSpec):
        reply = spec_or_reply.scripted_reply
        assert reply is not None, f"system {spec_or_reply.name} has no scripted replies"
    else:
        reply = spec_or_reply
    with Front(reply, dims, encoder=encoder) as f:
        yield f


# --- the worker -------------------------------------------------------------------------------

class WorkerProcess:
    """`<env python> <SPEC.worker_path>` in `<tmp>/home_<name>` with the job's offline
    environment, its stderr in `<tmp>/worker_<name>.log`. As a context manager it asserts a
    clean exit (0) at the end."""

    def __init__(self, spec: SystemSpec, tmp: Path, name: str, *, clock: str,
                 settings: Mapping[str, Any] | None = None) -> None:
        self.spec = spec
        self.clock = clock
        self.settings = {**spec.options, **(settings or {})}
        self.home = tmp / f"home_{name}"
        self.home.mkdir(parents=True, exist_ok=True)
        env = worker_env(spec, self.home)
        if official_dir():
            # a worker reads a harness's text from the official checkouts (LangMem's prompt)
            env["STRUCTMEM_OFFICIAL_DIR"] = official_dir()
        if spec.repository is not None:
            env["STRUCTMEM_SYSTEM_SRC"] = str(envs.source_dir(spec, systems_dir()))
        self.log_path = tmp / f"worker_{name}.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen([str(system_python(spec)), str(spec.worker_path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, cwd=str(self.home))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(self, msg: Mapping[str, Any], timeout: float = 300) -> dict[str, Any]:
        """Send one request, return its reply (an "error" reply included)."""
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no reply to {msg.get('op')} within {timeout} s (see {self.log_path})"
        line = self.proc.stdout.readline()
        assert line, f"worker died:\n{self.log_text()[-3000:]}"
        return json.loads(line)

    def ask(self, msg: Mapping[str, Any], timeout: float = 300) -> dict[str, Any]:
        """`call`, asserting that the reply is not an error."""
        reply = self.call(msg, timeout)
        assert reply["op"] != "error", f"{reply['error']}\n{reply.get('log_tail')}"
        return reply

    def hello(self, **settings: Any) -> dict[str, Any]:
        """The hello (settings: the spec's options, the defaults given, then these)."""
        return self.call({"op": "hello", "system": self.spec.name, "clock": self.clock,
                          "settings": {**self.settings, **settings}})

    def close(self) -> int:
        """Ask the worker to exit (if it runs); its exit status."""
        if self.proc.poll() is None:
            assert self.proc.stdin
            self.proc.stdin.write(b'{"op": "exit"}\n')
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.close() == 0, f"worker exited badly (see {self.log_path})"


def hashes(rows: Any, system: str, endpoint: str = "chat") -> list[str]:
    """The messages hashes of the front's rows of `system`'s `endpoint` (chat | embeddings)."""
    return rows.filter(rows["prompt_version"] == f"{system}/{endpoint}")["messages_hash"].to_list()
