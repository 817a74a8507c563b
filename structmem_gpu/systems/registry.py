"""A baseline system's spec by name: `structmem_gpu.systems.<name>:SPEC` (no list to edit)."""

from __future__ import annotations

import importlib
import pkgutil

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.systems.spec import SYSTEMS_DIR, SystemSpec

# Modules of this package that are machinery, not systems.
_NOT_SYSTEMS = frozenset({"admin", "answer", "envs", "front", "pool", "protocol", "registry", "spec",
                          "stages", "workers", "locks"})


def system_names(tier: str | None = None) -> list[str]:
    """Every packaged system (a module of this package with a SPEC), or those of one test tier
    (SystemSpec.tier: "ci" | "heavy")."""
    names = []
    for info in pkgutil.iter_modules([str(SYSTEMS_DIR)]):
        if info.name in _NOT_SYSTEMS or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"structmem_gpu.systems.{info.name}")
        spec = getattr(mod, "SPEC", None)
        if isinstance(spec, SystemSpec) and tier in (None, spec.tier):
            names.append(info.name)
    return sorted(names)


def system_spec(name: str) -> SystemSpec:
    if name in _NOT_SYSTEMS or not name.isidentifier():
        raise ConfigError(f"system.name={name!r}: expected one of {system_names()}")
    try:
        mod = importlib.import_module(f"structmem_gpu.systems.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"structmem_gpu.systems.{name}":
            raise
        raise ConfigError(f"system.name={name!r}: expected one of {system_names()}") from None
    spec = getattr(mod, "SPEC", None)
    if not isinstance(spec, SystemSpec):
        raise ConfigError(f"structmem_gpu/systems/{name}.py has no SPEC (a SystemSpec)")
    return spec
