"""The stages of a job: the one place a job's config is turned into its stages.

    stages = job_stages(cfg)     # Mapping name -> Stage, lazily imported
    check_config(cfg, stages.values())
    run_stages(cfg, run_dir, stages)

Every stage the job's method has is returned, the ones that run only when listed in
`stages=[...]` (the fidelity audits) included, so that validation covers their settings too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from structmem_gpu.stage import Stage


def job_stages(cfg: Any) -> Mapping[str, Stage]:
    from structmem_gpu.methods.registry import stage_registry

    return stage_registry(str(cfg["method"]["name"]))
