"""String knobs whose values a higher layer registers: `llm.backend` names a backend module of
structmem_gpu/llm/backends/, which the configuration layer may not import. The package's
__init__ connects the two (`provide`), as it registers the `llm_or` resolver; the settings
field carries `OneOf(key)`, which validates and lists the values.

    backend: Annotated[str, OneOf("llm.backend").validator, OneOf("llm.backend")] = "llamacpp"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_SOURCES: dict[str, Callable[[], Sequence[str]]] = {}


def provide(key: str, names: Callable[[], Sequence[str]]) -> None:
    """Register where the values of knob `key` come from (called once, at import)."""
    _SOURCES[key] = names


class OneOf:
    """Annotated marker of a string knob whose values are registered elsewhere (`provide`);
    `choices()` lists them (tests enumerate a field's values through it)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def choices(self) -> tuple[str, ...]:
        if self.key not in _SOURCES:
            raise ValueError(f"{self.key}: no registry provides its values (structmem_gpu/__init__.py)")
        return tuple(_SOURCES[self.key]())

    def check(self, value: str) -> str:
        """Pydantic after-validator: `value` is a registered name."""
        known = self.choices()
        if value not in known:
            raise ValueError(f"unknown {self.key} {value!r}; registered: {', '.join(sorted(known))}")
        return value
