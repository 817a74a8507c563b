"""Stages looked up by their "module:ATTR" references, imported only when used: a method's
`implementations` (methods/registry.py builds a job's stages with it) and a finished run's
stages as its saved config declares them (`RunStages`: their order and parts, for the cost
tables, the figures and the cost report, which have a run directory and no job).
"""

from __future__ import annotations

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


def packaged_stages() -> dict[str, Stage]:
    """Stage name -> Stage over every packaged method (conf/method/*.yaml `implementations`;
    the first method naming a stage wins: same-named stages share their part). For a run
    directory without a saved config, and for a stage its saved config no longer imports."""
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

    def __init__(self, run_dir: Any = None) -> None:
        import json
        from pathlib import Path

        from structmem_gpu.config.run_changes import previous_config

        # None = no run directory: the packaged methods' declarations alone.
        root = None if run_dir is None else Path(run_dir)
        saved = (previous_config(root) if root is not None else None) or {}
        method = saved.get("method") or {}
        self.order: tuple[str, ...] = tuple(str(s) for s in method.get("stages") or ())
        self._refs = {str(k): str(v) for k, v in (method.get("implementations") or {}).items() if v}
        self._where = f"{run_dir}/.hydra/config.yaml"
        manifest = root / "manifest.json" if root is not None else None
        entries = (json.loads(manifest.read_text()).get("stages") or {}) if manifest and manifest.is_file() else {}
        self._recorded = {n: e["part"] for n, e in entries.items() if isinstance(e, dict) and e.get("part")}
        self._own_stages: dict[str, Stage] | None = None
        self._packaged: dict[str, Stage] | None = None

    @property
    def _own(self) -> dict[str, Stage]:
        """The saved config's stages, imported on first need (a run older than the recorded
        parts, or a stage that did not run)."""
        if self._own_stages is None:
            self._own_stages = _importable(implementations(self._refs, self._where))
        return self._own_stages

    def stage(self, name: str) -> Stage | None:
        if name in self._own:
            return self._own[name]
        if self._packaged is None:
            self._packaged = packaged_stages()
        return self._packaged.get(name)

    def part(self, name: str) -> str:
        if name in self._recorded:
            return str(self._recorded[name])
        stage = self.stage(name)
        return BUILD if stage is None else stage.kind

    def names(self, *parts: str) -> frozenset[str]:
        """The stages of the run (recorded in its manifest, its method's, the packaged ones)
        whose part is in `parts`."""
        if self._packaged is None:
            self._packaged = packaged_stages()
        every = {**{n: s.kind for n, s in {**self._packaged, **self._own}.items()}, **self._recorded}
        return frozenset(n for n, part in every.items() if part in parts)
