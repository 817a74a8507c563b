"""Which stage implementation each method uses, by stage name.

Methods differ only in these functions, never in the plumbing (DESIGN principle 2). Entries
are "module:attribute" strings imported on demand, so a method's stages load only when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from structmem_gpu.errors import ConfigError
from structmem_gpu.stage import Stage

_LOAD = "structmem_gpu.methods.load:STAGE"
_ANSWER = "structmem_gpu.eval.answer:STAGE"
_JUDGE = "structmem_gpu.eval.judge:STAGE"
_REPORT = "structmem_gpu.eval.report:STAGE"
_STRUCTMEM = {
    "load": _LOAD,
    "extract": "structmem_gpu.methods.structmem.extract:STAGE",
    "embed": "structmem_gpu.methods.structmem.embed:STAGE",
    "consolidate": "structmem_gpu.methods.structmem.consolidate:STAGE",
    "retrieve": "structmem_gpu.methods.structmem.retrieve:STAGE",
    "answer": _ANSWER,
    "judge": _JUDGE,
    "report": _REPORT,
}

METHODS: dict[str, dict[str, str]] = {
    "structmem": _STRUCTMEM,
    "structmem_no_cross_event": _STRUCTMEM,
    "full_context": {"load": _LOAD, "answer": _ANSWER, "judge": _JUDGE, "report": _REPORT},
}


def _resolve(ref: str) -> Stage:
    module, _, attr = ref.partition(":")
    stage = getattr(importlib.import_module(module), attr)
    if not isinstance(stage, Stage):
        raise TypeError(f"{ref} is not a Stage")
    return stage


class _LazyStages(Mapping[str, Stage]):
    """Stage name -> Stage, importing a stage's module only when that stage is used."""

    def __init__(self, refs: Mapping[str, str]) -> None:
        self._refs = dict(refs)

    def __getitem__(self, name: str) -> Stage:
        return _resolve(self._refs[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def stage_registry(method: str) -> Mapping[str, Stage]:
    if method not in METHODS:
        raise ConfigError(f"unknown method '{method}'; known: {sorted(METHODS)}")
    return _LazyStages(METHODS[method])
