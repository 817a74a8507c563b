"""vLLM's engine in this process (`vllm.LLM`, no server, no HTTP)."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.spec import SETUP_GPU, Backend, EngineProblem, OpenContext, server_env

if TYPE_CHECKING:
    from structmem_gpu.config.schema import LLMSettings


@register
class VLLMOffline(Backend):
    name = "vllm_offline"
    launches = True
    gpu_kind = "vLLM engine (in process)"
    hf_weights = True
    http = False

    def engine_problem(self, s: "LLMSettings", key: str) -> EngineProblem | None:
        if importlib.util.find_spec("vllm") is not None:
            return None
        return EngineProblem(f"vllm is not importable in {sys.executable}", SETUP_GPU)

    def open(self, s: "LLMSettings", ctx: OpenContext) -> Any:
        inner = offline_backend(s, ctx.model_id)
        ctx.stack.callback(inner.close)
        return inner


def offline_backend(c: "LLMSettings", model_id: str) -> Any:
    """The in-process engine for llm settings `c` (llm/vllm_offline.py)."""
    from structmem_gpu.config.identity import reply_params
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.llm.vllm_offline import VLLMOfflineBackend

    if not c.model:
        raise ConfigError("llm.backend=vllm_offline needs llm.model (HF id or folder)")
    engine: dict[str, Any] = {
        "tensor_parallel_size": c.tensor_parallel_size,
        "seed": c.seed,
        "gpu_memory_utilization": c.gpu_memory_utilization,
        "served_model_name": c.served_name,
        "generation_config": "vllm",  # same reason as the server's --generation-config vllm
    }
    for key in ("max_model_len", "max_num_seqs", "revision"):
        if getattr(c, key) is not None:
            engine[key] = getattr(c, key)
    engine.update(dict(c.engine_kwargs or {}))
    if c.extra_args:
        raise ConfigError("llm.extra_args is for servers; vllm_offline takes no CLI arguments")
    return VLLMOfflineBackend(
        model=str(c.model),
        served_name=str(c.served_name),
        model_id=model_id,
        engine_kwargs=engine,
        chat_template_kwargs=c.chat_template_kwargs,
        repair_attempts=c.repair_attempts,
        progress=bool(c.progress),
        env=server_env(c),
        reply_params=reply_params(c),
    )
