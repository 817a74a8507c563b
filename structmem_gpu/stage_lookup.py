"""Stages looked up by their "module:ATTR" references, imported only when used: a method's
`implementations` (methods/registry.py builds a job's stages with it) and a finished run's
stages as its saved config declares them (`RunStages`: their order and parts, for the cost
tables, the figures and the cost report, which have a run directory and no job).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.stage_parts import BUILD
from structmem_gpu.stage import Stage


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


# ---- a finished run's stages, for readers without a job (cost tables, figures) -------------


@functools.lru_cache(maxsize=1)
def packaged_stages() -> dict[str, Stage]:
    """Stage name -> Stage over every packaged method (conf/method/*.yaml `implementations`;
    the first method naming a stage wins: same-named stages share their part). For a run
    directory without a saved config, and for a stage its saved config no longer imports.
    Read once per process (conf/method/ does not change under a running process); not to be
    mutated."""
    import yaml

    from structmem_gpu.config.yaml_defaults import CONF_DIR

    out: dict[str, Stage] = {}
    for path in sorted((CONF_DIR / "method").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        refs = (data.get("method") or {}).get("implementations") or {}
        for name, stage in _importable(implementations(refs, str(path))).items():
            out.setdefault(name, stage)
    return out


def _importable(stages: Mapping[str, Stage]) -> dict[str, Stage]:
    out = {}
    for name in stages:
        try:
            out[name] = stages[name]
        except ConfigError:  # moved or renamed since the run: the packaged methods answer
            continue
    return out


class RunStages:
    """A finished run's stages as its method declared them: their order (`method.stages` of
    .hydra/config.yaml) and each stage's part: the one manifest.json records (`part`, written
    since issue 41; read without importing a stage), else Stage.kind of the saved config's
    `method.implementations` (imported), else of the packaged methods' stage of that name,
    else "build" (an unknown stage's requests are counted, never dropped from a cost)."""

    def __init__(self, run_dir: Any = None, manifest: Mapping[str, Any] | None = None) -> None:
        """`run_dir` None = no run directory: the packaged methods' declarations alone.
        `manifest`: the run's manifest.json when the caller has read it already."""
        import json
        from pathlib import Path

        self._root = None if run_dir is None else Path(run_dir)
        if manifest is None and self._root is not None and (self._root / "manifest.json").is_file():
            manifest = json.loads((self._root / "manifest.json").read_text())
        entries = (manifest or {}).get("stages") or {}
        self._recorded = {n: e["part"] for n, e in entries.items() if isinstance(e, dict) and e.get("part")}

    @functools.cached_property
    def _method(self) -> Mapping[str, Any]:
        """The saved config's `method` node, read on first need: a run older than the recorded
        parts, a stage that did not run, or the order."""
        from structmem_gpu.config.run_changes import previous_config

        saved = (previous_config(self._root) if self._root is not None else None) or {}
        return saved.get("method") or {}

    @property
    def order(self) -> tuple[str, ...]:
        """The method's `stages`, in run order (() without a saved config)."""
        return tuple(str(s) for s in self._method.get("stages") or ())

    @functools.cached_property
    def _own(self) -> dict[str, Stage]:
        """The saved config's stages (`method.implementations`), imported on first need."""
        refs = {str(k): str(v) for k, v in (self._method.get("implementations") or {}).items() if v}
        return _importable(implementations(refs, f"{self._root}/.hydra/config.yaml"))

    def stage(self, name: str) -> Stage | None:
        if name in self._own:
            return self._own[name]
        return packaged_stages().get(name)

    def part(self, name: str) -> str:
        if name in self._recorded:
            return str(self._recorded[name])
        stage = self.stage(name)
        return BUILD if stage is None else stage.kind

    def names(self, *parts: str) -> frozenset[str]:
        """The stages of the run (recorded in its manifest, its method's, the packaged ones)
        whose part is in `parts`."""
        every = {**{n: s.kind for n, s in {**packaged_stages(), **self._own}.items()}, **self._recorded}
        return frozenset(n for n, part in every.items() if part in parts)
