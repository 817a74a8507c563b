"""Stage `load`: benchmark file -> tables/turns.parquet + tables/questions.parquet.

    python jobs/run.py benchmark=locomo benchmark.path=locomo10.json stages=[load] hydra.run.dir=DIR

Sharding happens here: with num_shards > 1 only this shard's conversations are kept, assigned
by a deterministic greedy balance of text volume (largest conversation first, to the lightest
shard), so shards take similar LLM time rather than similar conversation counts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl
from omegaconf import DictConfig, OmegaConf

from structmem_gpu.errors import ConfigError
from structmem_gpu.hashing import file_sha256
from structmem_gpu.stage import Stage, StageContext

log = logging.getLogger(__name__)


def shard_assignment(volumes: dict[str, int], num_shards: int) -> dict[str, int]:
    """conv_id -> shard, balancing total volume; deterministic (ties broken by conv_id)."""
    loads = [0] * num_shards
    out = {}
    for conv, vol in sorted(volumes.items(), key=lambda kv: (-kv[1], kv[0])):
        shard = min(range(num_shards), key=lambda s: (loads[s], s))
        out[conv] = shard
        loads[shard] += vol
    return out


def apply_shard(turns: pl.DataFrame, questions: pl.DataFrame, shard_index: int, num_shards: int
                ) -> tuple[pl.DataFrame, pl.DataFrame]:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ConfigError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    if num_shards == 1:
        return turns, questions
    vol = turns.group_by("conv_id").agg(pl.col("text").str.len_chars().sum().alias("v"))
    assign = shard_assignment(dict(zip(vol["conv_id"].to_list(), vol["v"].to_list())), num_shards)
    keep = [c for c, s in assign.items() if s == shard_index]
    return turns.filter(pl.col("conv_id").is_in(keep)), questions.filter(pl.col("conv_id").is_in(keep))


def _benchmark_args(cfg: DictConfig) -> dict[str, Any]:
    b = cfg.benchmark
    convs = OmegaConf.to_container(b.conversations) if b.get("conversations") is not None else None
    return {"name": str(b.name), "path": None if b.get("path") is None else str(b.path),
            "conversations": convs, "max_sessions": b.get("max_sessions")}


def _file_hash(cfg: DictConfig) -> str | None:
    """The benchmark file's sha256, so an edited file invalidates `load` and everything after."""
    args = _benchmark_args(cfg)
    path = args["path"]
    if path is None and args["name"] == "sample":
        from structmem_gpu.data import sample_path

        path = str(sample_path())
    return file_sha256(path) if path and Path(path).is_file() else None


def run_load(ctx: StageContext) -> dict[str, pl.DataFrame]:
    from structmem_gpu.data import load_benchmark

    turns, questions = load_benchmark(**_benchmark_args(ctx.cfg))
    turns, questions = apply_shard(turns, questions, int(ctx.cfg.shard_index), int(ctx.cfg.num_shards))
    ctx.notes.update(conversations=turns["conv_id"].n_unique(), turns=turns.height,
                     sessions=turns.select("conv_id", "session_index").unique().height,
                     questions=questions.height)
    log.info("loaded %s", ctx.notes)
    return {"turns": turns, "questions": questions}


STAGE = Stage(
    name="load", run=run_load, writes=("turns", "questions"),
    config_keys=("benchmark.name", "benchmark.path", "benchmark.conversations", "benchmark.max_sessions",
                 "shard_index", "num_shards"),
    extra_fingerprint=_file_hash,
)
