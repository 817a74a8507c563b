"""An OpenAI-compatible endpoint this job neither starts nor places (`llm.base_url` required):
a hosted API, or a server another job runs. Every default of spec.Backend is this one."""

from __future__ import annotations

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.spec import Backend


@register
class External(Backend):
    name = "external"
