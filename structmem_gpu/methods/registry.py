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
    # Fidelity audits (paper A.6): run only when listed in stages=[...], never in method.stages.
    "audit_extraction": "structmem_gpu.eval.audit_extraction:STAGE",
    "audit_consolidation": "structmem_gpu.eval.audit_consolidation:STAGE",
}

_SEEM = {
    "load": _LOAD,
    "frames": "structmem_gpu.methods.seem.frames:STAGE",
    "fusion": "structmem_gpu.methods.seem.fusion:STAGE",
    "graph": "structmem_gpu.methods.seem.graph:STAGE",
    "retrieve": "structmem_gpu.methods.seem.retrieve:STAGE",
    "answer": _ANSWER,  # answer.prompt: seem picks SEEM's context builder
    "judge": _JUDGE,
    "report": _REPORT,
}

_BASELINES = "structmem_gpu.methods.baselines"
# Flat memory: StructMem's own build stages (factual perspective only, no consolidate).
_FLAT = {k: v for k, v in _STRUCTMEM.items() if k != "consolidate"}
_GRAPH_MEMORY = {
    "load": _LOAD,
    "extract": _STRUCTMEM["extract"],
    "embed": _STRUCTMEM["embed"],
    "graph": f"{_BASELINES}.graph_memory:STAGE",
    "retrieve": f"{_BASELINES}.graph_retrieve:STAGE",
    "answer": _ANSWER,
    "judge": _JUDGE,
    "report": _REPORT,
}
_TURN_RAG = {
    "load": _LOAD,
    "embed": f"{_BASELINES}.turn_rag:EMBED_STAGE",
    "retrieve": f"{_BASELINES}.turn_rag:RETRIEVE_STAGE",
    "answer": _ANSWER,
    "judge": _JUDGE,
    "report": _REPORT,
}

METHODS: dict[str, dict[str, str]] = {
    "structmem": _STRUCTMEM,
    "structmem_no_cross_event": _STRUCTMEM,
    "full_context": {"load": _LOAD, "answer": _ANSWER, "judge": _JUDGE, "report": _REPORT},
    "flat": _FLAT,
    "graph_memory": _GRAPH_MEMORY,
    "turn_rag": _TURN_RAG,
    "seem": _SEEM,
    # Paper Table 3 ablations (conf/method/seem_no_*.yaml): same stages, one switch off.
    "seem_no_fact_context": _SEEM,
    "seem_no_ppr": _SEEM,
    "seem_no_rpe": _SEEM,
    "seem_no_eef": _SEEM,
    "seem_no_eef_rpe": _SEEM,
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
