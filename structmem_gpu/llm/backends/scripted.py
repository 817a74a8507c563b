"""The scripted LLM (llm/scripted.py): deterministic, schema-valid, input-derived replies in
this process; the unit tests' and `debug=scripted` harness runs' backend, never a result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.spec import Backend, OpenContext

if TYPE_CHECKING:
    from structmem_gpu.config.schema import LLMSettings


@register
class Scripted(Backend):
    name = "scripted"
    http = False
    harness = True

    def open(self, s: "LLMSettings", ctx: OpenContext) -> Any:
        from structmem_gpu.llm.scripted import ScriptedLLM

        return ScriptedLLM(model_id=ctx.model_id, repair_attempts=s.repair_attempts)
