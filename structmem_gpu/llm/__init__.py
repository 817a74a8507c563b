"""LLM serving layer: servers, the async batch client, structured output, the response cache.

    from structmem_gpu.llm import open_llm, LLMRequest, Message, Sampling
    with open_llm(cfg.llm, log_dir=run_dir / "logs", cache_dir=cache_dir) as llm:
        results = llm.generate(requests, desc="extract")   # one LLMResult per request, in order

Importing this package is cheap: aiohttp, httpx, jsonschema and vllm load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from structmem_gpu.llm.types import LLMBackend, LLMRequest, LLMResult, Message, Sampling, request_id

if TYPE_CHECKING:
    from structmem_gpu.llm.factory import model_id, open_llm
    from structmem_gpu.llm.request_log import to_frame
    from structmem_gpu.llm.scripted import ScriptedLLM

__all__ = [
    "LLMBackend",
    "LLMRequest",
    "LLMResult",
    "Message",
    "Sampling",
    "ScriptedLLM",
    "model_id",
    "open_llm",
    "request_id",
    "to_frame",
]

_LAZY = {
    "open_llm": "structmem_gpu.llm.factory",
    "model_id": "structmem_gpu.llm.factory",
    "to_frame": "structmem_gpu.llm.request_log",
    "ScriptedLLM": "structmem_gpu.llm.scripted",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
