"""StructMem's prompt texts (extraction, synthesis, update, audits, the LightMem reference)."""

from __future__ import annotations

from types import ModuleType

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.structmem.prompts import factual, relational

# kind of entry -> prompt module (each has VERSION, KIND, SYSTEM)
EXTRACTION_PROMPTS: dict[str, ModuleType] = {factual.KIND: factual, relational.KIND: relational}


def extraction_prompt(kind: str) -> ModuleType:
    """The prompt module of an extraction perspective ("fact" | "relation")."""
    try:
        return EXTRACTION_PROMPTS[kind]
    except KeyError:
        raise ConfigError(
            f"extract.perspectives: unknown perspective {kind!r}; expected some of {sorted(EXTRACTION_PROMPTS)}"
        ) from None
