"""The inference backends, each one module that describes itself (`llm.backend=<name>`).

    from structmem_gpu.llm.backends import backend, names
    spec = backend("vllm_server")     # the Backend registered under that name
    spec.gpu_kind, spec.context_knob  # what the GPU plan and the context guard ask

A backend is a `Backend` subclass (llm/backends/spec.py) in a module of this package, decorated
with `@register`: whether the job launches it, whether it sits on a GPU, its context-length knob,
its token counter, how it opens (server command, in-process engine, attached URL), where its
weights are, what the preflight checks. The factory, the preflight, the GPU plan, the context
guard, the dry run and the benchmarks ask it; none of them names a backend. Adding a backend
is a module here plus a profile in conf/llm/ (which states only what differs from _base.yaml).
A test may register its own with `registered(...)` and take it back afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator

from structmem_gpu.llm.backends.spec import Backend, OpenContext

_REGISTRY: dict[str, Backend] = {}
_loaded = False


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: register one instance of `cls` under `cls.name` (a second backend of
    that name is an error, not a silent replacement)."""
    name = cls.name
    if not name:
        raise ValueError(f"{cls.__name__}: a backend needs a name")
    if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
        raise ValueError(f"backend {name!r} is registered twice ({type(_REGISTRY[name]).__name__}, {cls.__name__})")
    _REGISTRY[name] = cls()
    return cls


def _load_packaged() -> None:
    """Import every module of this package once, so each registers its backend (cheap: a
    backend module imports its engine only when asked to open or check it)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in pkgutil.iter_modules(__path__):
        if info.name != "spec":
            importlib.import_module(f"{__name__}.{info.name}")


def names() -> tuple[str, ...]:
    """Every registered backend's name, sorted."""
    _load_packaged()
    return tuple(sorted(_REGISTRY))


def backend(name: str) -> Backend:
    """The backend registered as `name`; a ValueError naming the known ones otherwise."""
    _load_packaged()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown llm.backend {name!r}; registered: {', '.join(names())}") from None


@contextlib.contextmanager
def registered(cls: type[Backend]) -> Iterator[Backend]:
    """Register `cls` for the duration of a `with` block (tests: a fixture backend)."""
    _load_packaged()
    if cls.name in _REGISTRY:
        raise ValueError(f"backend {cls.name!r} is already registered")
    register(cls)
    try:
        yield _REGISTRY[cls.name]
    finally:
        _REGISTRY.pop(cls.name, None)


__all__ = ["Backend", "OpenContext", "backend", "names", "register", "registered"]
