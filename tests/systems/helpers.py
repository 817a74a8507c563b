"""Shared by the systems tier: where the systems' environments are, and whether one is there."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.systems import envs
from structmem_gpu.systems.registry import system_spec
from tests.systems.worker_driver import systems_dir


def missing_env(name: str) -> str | None:
    """Why system `name` cannot run here (None: its environment is installed from its lock)."""
    try:
        envs.check_env(system_spec(name), systems_dir())
    except ConfigError as err:
        return str(err)
    return None


def table(run_dir: Path, name: str) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "tables" / f"{name}.parquet")


def system_requests(run_dir: Path, name: str) -> pl.DataFrame:
    """The requests.parquet rows the recording front wrote for system `name`."""
    req = table(run_dir, "requests")
    return req.filter(pl.col("prompt_version").str.starts_with(f"{name}/"))
