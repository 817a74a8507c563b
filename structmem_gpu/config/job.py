"""One job's configuration as typed objects: what stages, backends and drivers read.

    job = JobConfig.from_cfg(cfg)          # the entry point's Hydra DictConfig, checked once
    job.root.llm.model                     # the job's typed nodes (config.schema.JobSettings)
    job.root.paths.cache_dir
    job.settings(ConsolidateSettings)      # a stage's own node, typed and checked (cached)

Only the configuration package and the entry points (jobs/*.py) read OmegaConf; everything
below them receives a JobConfig (a stage: `ctx.job`) or the typed settings it needs. There is
no plain view of the configuration: the config hash and the fingerprints are the identity of
the typed settings (config/identity.py); `has(key)` says whether the config states a node,
`with_values(...)` varies a job's root keys (a merged report, a benchmark rerun).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from structmem_gpu.config.schema import JobSettings
from structmem_gpu.config.settings import Settings, select as _select, to_plain

S = TypeVar("S", bound=Settings)
_MISSING = object()


class JobConfig:
    """A checked job configuration: typed root nodes plus each node's settings on demand."""

    def __init__(self, plain: Mapping[str, Any]) -> None:
        self._plain = dict(plain)
        self.root: JobSettings = JobSettings.from_cfg(self._plain)
        self._settings: dict[type, Any] = {}

    @classmethod
    def from_cfg(cls, cfg: Any) -> "JobConfig":
        """From a Hydra/OmegaConf config (interpolations resolved) or a plain mapping; a
        JobConfig is returned as it is."""
        if isinstance(cfg, JobConfig):
            return cfg
        return cls(to_plain(cfg))

    @property
    def stage_names(self) -> list[str]:
        """The stages this job runs, in order: `stages` when given, else the method's list."""
        return list(self.root.stages or self.root.method.stages or ())

    def settings(self, cls: type[S]) -> S:
        """The typed settings of `cls.node` for this job (checked once, then cached)."""
        if cls not in self._settings:
            self._settings[cls] = cls.from_cfg(self._plain)
        return self._settings[cls]

    def select(self, key: str, default: Any = None) -> Any:
        """The resolved value at dotted `key`, for readers whose keys are data rather than code:
        the published rows' match keys (eval/published.py). Code that names a key reads the
        typed field (`root`, `settings(...)`): tests/unit/test_typed_config.py."""
        return _select(self._plain, key, default)

    def has(self, key: str) -> bool:
        return _select(self._plain, key, _MISSING) is not _MISSING

    def with_values(self, **root_keys: Any) -> "JobConfig":
        """This configuration with root keys replaced (e.g. stages=["report"], force=True),
        checked anew: a driver's variation of a job (a merged report, a benchmark rerun)."""
        return JobConfig({**self._plain, **root_keys})
