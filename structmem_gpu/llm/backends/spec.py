"""What a backend says about itself (llm/backends/__init__.py registers one per module).

Every attribute and method has the default of an OpenAI-compatible HTTP endpoint that this
job neither launches nor places: a backend overrides only what differs. Nothing here imports an
engine; a method that needs one imports it when called.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from structmem_gpu.config.schema import LLMSettings
    from structmem_gpu.llm.prompt_counter import TokenCounter
    from structmem_gpu.llm.server import CommandBuilder

SETUP_GPU = "make setup-gpu"  # what installs vLLM and faiss-gpu on a GPU node


@dataclass(frozen=True)
class WeightsRef:
    """The weights a launched backend loads (for the prefetch, the preflight, the GPU plan)."""

    name: str  # hub id, local folder or file
    revision: str | None = None
    gguf: bool = False  # a llama.cpp GGUF file: must be a local file
    convert_from_gguf: str | None = None  # vllm_cpu: the folder is made from a GGUF on first use


@dataclass(frozen=True)
class OpenContext:
    """What `Backend.open` gets from the factory (llm/factory.py open_llm)."""

    stack: contextlib.ExitStack  # closes what the backend opens, when the job's use ends
    log_dir: Path  # server logs: <log_dir>/<name>.server.log
    name: str  # the role ("llm", a judge's name): one server each
    model_id: str  # what identifies the weights (factory.model_id): cache keys, result rows
    http_backend: Callable[["LLMSettings", str], Any]  # the HTTP client for a base URL


@dataclass(frozen=True)
class EngineProblem:
    """What this machine lacks to run a launched backend (the preflight's finding)."""

    problem: str
    fix: str


class Backend:
    """One inference backend: its name in `llm.backend` and what the job asks of it."""

    name: ClassVar[str] = ""
    # The job starts it and loads its weights (unless `llm.base_url` attaches to a server that
    # runs already): the prefetch fetches them, the preflight checks them and the engine.
    launches: ClassVar[bool] = False
    # What holds GPU memory when launched ("vLLM server"); None = nothing of it on a GPU.
    gpu_kind: ClassVar[str | None] = None
    # The llm key stating the model's context in tokens (the context guard, the dry run).
    context_knob: ClassVar[str] = "max_model_len"
    # The job loads Hugging Face weights itself (vLLM): the weights version is the resolved
    # snapshot, and `convert_from_gguf` makes the folder first.
    hf_weights: ClassVar[bool] = False
    # It serves over HTTP: `llm.base_url` attaches to a running server (not ours: never planned
    # on our GPUs), and the benchmarks can time its endpoint. False: in-process engines.
    http: ClassVar[bool] = True
    # A launched server: the path that answers 200 once it is ready, and the signal that stops it.
    ready_path: ClassVar[str] = "/health"
    death_signal: ClassVar[int] = signal.SIGTERM
    # Replies are scripted, not a model's: never compared with a paper (eval/published.py).
    harness: ClassVar[bool] = False
    # `llm.chat_template_kwargs` travel in the request body (servers that template themselves).
    body_chat_template_kwargs: ClassVar[bool] = True

    def flavor(self, s: "LLMSettings") -> str:
        """The structured-output dialect of its requests (llm/structured.py FLAVORS)."""
        return s.api_flavor or "vllm"

    def default_model(self, s: "LLMSettings") -> str | None:
        """What the model is called in the identity when `llm.model` is null."""
        return None

    def launched(self, s: "LLMSettings") -> bool:
        """Whether this job starts the model itself (not attached, external or scripted)."""
        return self.launches and not s.base_url

    def weights(self, s: "LLMSettings") -> WeightsRef | None:
        """The weights a launched backend loads; None = none to find (the factory refuses a
        config that needs a model and names none, with its own line)."""
        if not s.model:
            return None
        return WeightsRef(str(s.model), revision=s.revision, convert_from_gguf=s.convert_from_gguf)

    def engine_problem(self, s: "LLMSettings", key: str) -> EngineProblem | None:
        """What this machine lacks to launch it (`key`: its config node, for the fix)."""
        return None

    def token_counter(self, s: "LLMSettings") -> "TokenCounter | None":
        """The model's own prompt counter when the backend has one (the dry run); None = the
        configured tokenizer, else characters / 4."""
        return None

    def open(self, s: "LLMSettings", ctx: OpenContext) -> Any:
        """The inner backend (before cache, dedup and guard): attached when `base_url` is set,
        else launched under a supervisor that replaces a dead server."""
        if s.base_url:
            return ctx.http_backend(s, str(s.base_url))
        from structmem_gpu.core.errors import ConfigError

        if not self.launches:
            raise ConfigError(f"llm.backend={self.name} needs llm.base_url (http://HOST:PORT/v1)")
        from structmem_gpu.llm.supervisor import ServerSupervisor, SupervisedBackend

        sup = ctx.stack.enter_context(ServerSupervisor(
            lambda: self.launch(s, ctx.log_dir, ctx.name), name=ctx.name, max_restarts=s.max_restarts
        ))
        srv = sup.start()
        http = ctx.http_backend(s, srv.base_url)
        http.server = srv  # the client fails fast once this process is gone
        return SupervisedBackend(http, sup)  # ... and a dead server is replaced

    def command(self, s: "LLMSettings") -> "CommandBuilder":
        """Its server command (llm/server.py); only backends that launch a server."""
        raise NotImplementedError(f"llm.backend={self.name} launches no server")

    def launch_env(self, s: "LLMSettings") -> dict[str, str] | None:
        """The launched server's environment additions (None = this process's as is)."""
        return None

    def launch(self, s: "LLMSettings", log_dir: Path, name: str) -> contextlib.AbstractContextManager[Any]:
        """Start its server (llm/server.py launch_server), stopped with the block."""
        from structmem_gpu.llm.server import launch_server

        return launch_server(self.command(s), ready_path=self.ready_path, log_dir=log_dir,
                             name=name, startup_timeout_s=s.startup_timeout_s,
                             death_signal=self.death_signal, env=self.launch_env(s))


def server_env(s: "LLMSettings") -> dict[str, str]:
    """`llm.server_env` as strings: a launched vLLM server's environment, offline vLLM's."""
    return {str(k): str(v) for k, v in dict(s.server_env or {}).items()}
