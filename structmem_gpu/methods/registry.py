"""A job's stages, resolved from its method config (`method.implementations`).

A method is its YAML (conf/method/<name>.yaml): `method.stages` is the run order and
`method.implementations` maps every stage the method can run to an import path
"module:ATTR" of a `Stage`. A stage in `implementations` but not in `stages` runs only when
listed in `stages=[...]` (the fidelity audits); a null drops a stage inherited from another
method YAML. Modules are imported when a stage is looked up,
so a method's stages load only when used. Adding a method = adding a YAML file.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.settings import open_values
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.stage import Stage


def _method_file(job: JobConfig) -> str:
    # conf/method/<file>.yaml sets method.name to its file name (tests/unit/test_every_command.py).
    return f"conf/method/{job.root.method.name}.yaml"


class _LazyStages(Mapping[str, Stage]):
    """Stage name -> Stage, importing a stage's module only when that stage is used."""

    def __init__(self, refs: Mapping[str, str], where: str) -> None:
        self._refs = dict(refs)
        self._where = where

    def __getitem__(self, name: str) -> Stage:
        ref = self._refs[name]
        module, sep, attr = ref.partition(":")
        try:
            if not sep:
                raise ValueError("expected 'module:ATTR'")
            stage = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(
                f"{self._where}: stage '{name}' = {ref!r} cannot be imported ({exc})"
            ) from exc
        if not isinstance(stage, Stage):
            raise ConfigError(f"{self._where}: stage '{name}' = {ref!r} is not a Stage")
        return stage

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def implementations(refs: Mapping[str, Any], where: str) -> Mapping[str, Stage]:
    """Stage name -> Stage for a `method.implementations` mapping as plain data (a null drops
    the stage), imported lazily; `where` names the file in errors. For readers of a finished
    run's saved config (bench/cost.py); a job's own stages come from `stage_registry`."""
    return _LazyStages({str(k): str(v) for k, v in refs.items() if v is not None}, where)


def stage_registry(job: JobConfig | Mapping[str, Any]) -> Mapping[str, Stage]:
    """Stage name -> Stage for the job's method (`method.implementations`), imported lazily:
    the one place a job's config becomes its stages. Every stage the method maps is there,
    those that run only when listed in `stages=[...]` (the fidelity audits) included, so that
    config validation covers their settings too. `job`: a JobConfig, or the entry point's
    config (Hydra's or a plain resolved mapping), checked into one here."""
    job = JobConfig.from_cfg(job)
    where = _method_file(job)
    # method.implementations is an open mapping (stage name -> "module:ATTR" or null), each
    # value typed by MethodImplementations' open key.
    refs = open_values(job.root.method.implementations)
    if not refs:
        raise ConfigError(f"{where}: method.implementations is missing (stage name -> module:ATTR)")
    # A null removes a stage the method inherits (flat: StructMem's stages, no consolidate).
    registry = implementations(refs, where)
    missing = [s for s in job.root.method.stages if s not in registry]
    if missing:
        raise ConfigError(
            f"{where}: method.stages names {missing}, which method.implementations does not map"
        )
    return registry
