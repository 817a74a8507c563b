"""A job's stages, resolved from its method config (`method.implementations`).

A method is its YAML (conf/method/<name>.yaml): `method.stages` is the run order and
`method.implementations` maps every stage the method can run to an import path
"module:ATTR" of a `Stage`. A stage in `implementations` but not in `stages` runs only when
listed in `stages=[...]` (the fidelity audits); a null drops a stage inherited from another
method YAML. Modules are imported when a stage is looked up,
so a method's stages load only when used. Adding a method = adding a YAML file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.settings import open_values
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.stage import Stage
from structmem_gpu.stage_lookup import implementations


def _method_file(job: JobConfig) -> str:
    # conf/method/<file>.yaml sets method.name to its file name (tests/unit/test_every_command.py).
    return f"conf/method/{job.root.method.name}.yaml"


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


def method_stages(method: str, *parts: str) -> tuple[str, ...]:
    """The packaged method's run order (`method.stages` of conf/method/<method>.yaml, composed)
    restricted to stages whose part (Stage.kind) is in `parts`, e.g. the stages of a StructMem
    build: method_stages("structmem", INPUT, BUILD). For the benchmarks' schedules."""
    return _method_stages(method, tuple(parts))


@functools.lru_cache(maxsize=32)
def _method_stages(method: str, parts: tuple[str, ...]) -> tuple[str, ...]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from structmem_gpu.config.yaml_defaults import CONF_DIR

    overrides = [f"method={method}"]
    if GlobalHydra.instance().is_initialized():  # inside a Hydra job: its config dir is ours
        cfg = compose(config_name="config", overrides=overrides)
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    job = JobConfig.from_cfg(cfg)
    registry = stage_registry(job)
    return tuple(n for n in job.root.method.stages if registry[n].kind in parts)
