"""Pipeline plumbing: atomic tables, manifest last, skip by fingerprint, force, missing inputs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from omegaconf import OmegaConf

from structmem_gpu.artifacts import RunDir
from structmem_gpu.errors import MissingTableError
from structmem_gpu.pipeline import config_hash, run_stages
from structmem_gpu.stage import Stage, StageContext

CALLS: list[str] = []


def _make(ctx: StageContext) -> dict[str, pl.DataFrame]:
    CALLS.append("make")
    n = int(ctx.cfg.toy.n)
    return {"numbers": pl.DataFrame({"x": list(range(n))})}


def _double(ctx: StageContext) -> dict[str, pl.DataFrame]:
    CALLS.append("double")
    df = ctx.read("numbers")
    return {"doubled": df.with_columns(y=pl.col("x") * int(ctx.cfg.toy.factor))}


def _broken(ctx: StageContext) -> dict[str, pl.DataFrame]:
    raise RuntimeError("stage crashed")


REGISTRY = {
    "make": Stage("make", _make, writes=("numbers",), config_keys=("toy.n",)),
    "double": Stage("double", _double, reads=("numbers",), writes=("doubled",), config_keys=("toy.factor",)),
    "broken": Stage("broken", _broken, reads=("numbers",), writes=("never",)),
}


def cfg(**over):
    base = {"method": {"name": "toy", "stages": ["make", "double"]}, "benchmark": {"name": "t"},
            "stages": None, "force": False, "shard_index": 0, "num_shards": 1,
            "paths": {"cache_dir": "/nonexistent"}, "toy": {"n": 3, "factor": 2}}
    c = OmegaConf.create(base)
    for k, v in over.items():
        OmegaConf.update(c, k, v)
    return c


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def test_run_writes_tables_and_manifest(tmp_path: Path) -> None:
    outcomes = run_stages(cfg(), tmp_path, REGISTRY)
    assert [o.skipped for o in outcomes] == [False, False]
    run = RunDir(tmp_path)
    assert run.read_table("doubled")["y"].to_list() == [0, 2, 4]
    entry = run.stage_entry("double")
    assert entry["status"] == "done" and entry["outputs"]["doubled"]["rows"] == 3
    assert not list(tmp_path.rglob("*.tmp-*")), "temp files left behind"


def test_rerun_skips_and_force_recomputes(tmp_path: Path) -> None:
    run_stages(cfg(), tmp_path, REGISTRY)
    CALLS.clear()
    assert all(o.skipped for o in run_stages(cfg(), tmp_path, REGISTRY))
    assert CALLS == []
    run_stages(cfg(force=True), tmp_path, REGISTRY)
    assert CALLS == ["make", "double"]


def test_config_change_reruns_only_affected_stages(tmp_path: Path) -> None:
    run_stages(cfg(), tmp_path, REGISTRY)
    CALLS.clear()
    run_stages(cfg(**{"toy.factor": 5}), tmp_path, REGISTRY)
    assert CALLS == ["double"]
    CALLS.clear()
    run_stages(cfg(**{"toy.n": 4, "toy.factor": 5}), tmp_path, REGISTRY)
    assert CALLS == ["make", "double"], "a changed input table must invalidate downstream stages"


def test_tampered_output_is_recomputed(tmp_path: Path) -> None:
    run_stages(cfg(), tmp_path, REGISTRY)
    RunDir(tmp_path).write_table("doubled", pl.DataFrame({"x": [9]}))
    CALLS.clear()
    run_stages(cfg(), tmp_path, REGISTRY)
    assert CALLS == ["double"]


def test_missing_input_table_names_it(tmp_path: Path) -> None:
    with pytest.raises(MissingTableError, match=r"stage 'double' needs table 'numbers'"):
        run_stages(cfg(stages=["double"]), tmp_path, REGISTRY)


def test_crashed_stage_leaves_no_manifest_entry(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="stage crashed"):
        run_stages(cfg(stages=["make", "broken"]), tmp_path, REGISTRY)
    run = RunDir(tmp_path)
    assert run.stage_entry("make") is not None
    assert run.stage_entry("broken") is None
    assert not run.has_table("never")


def test_config_hash_ignores_paths_and_shards() -> None:
    a = config_hash(cfg())
    assert a == config_hash(cfg(**{"paths.cache_dir": "/else", "shard_index": 0, "num_shards": 4, "force": True}))
    assert a != config_hash(cfg(**{"toy.factor": 3}))


def test_replace_requests_keeps_other_stages(tmp_path: Path) -> None:
    from structmem_gpu.schemas import REQUESTS, frame

    def row(stage: str, rid: str) -> dict:
        return {k: None for k in REQUESTS} | {"request_id": rid, "stage": stage, "parse_ok": True, "cache_hit": False}

    run = RunDir(tmp_path)
    run.replace_requests("a", frame([row("a", "1"), row("a", "2")], REQUESTS))
    run.replace_requests("b", frame([row("b", "3")], REQUESTS))
    run.replace_requests("a", frame([row("a", "4")], REQUESTS))
    df = run.read_table("requests")
    assert sorted(df["request_id"].to_list()) == ["3", "4"]


def test_encoder_load_and_index_time_are_not_overhead(tmp_path: Path, monkeypatch) -> None:
    """The encoder's model load (first ctx.encoder() call, wherever a stage makes it) counts as
    encoder time and FAISS time as index time, so overhead_share is the framework's own."""
    import time

    import numpy as np

    from structmem_gpu.stage import Backends

    class SlowEncoder:
        def encode(self, texts: list[str]) -> np.ndarray:
            time.sleep(0.1)
            return np.zeros((len(texts), 2), dtype=np.float32)

    def load(self: Backends) -> SlowEncoder:
        if self._encoder is None:
            time.sleep(0.3)  # model load
            self._encoder = SlowEncoder()  # type: ignore[assignment]
        return self._encoder  # type: ignore[return-value]

    def stage(ctx: StageContext) -> dict[str, pl.DataFrame]:
        ctx.encoder()  # e.g. reading counters before encoding: loads the model
        ctx.encode(["a", "b"])
        t0 = time.perf_counter()
        time.sleep(0.2)  # stands in for FAISS build + search
        ctx.index_wall_s += time.perf_counter() - t0
        return {"numbers": pl.DataFrame({"x": [1]})}

    monkeypatch.setattr(Backends, "encoder", load)
    reg = {"make": Stage("make", stage, writes=("numbers",))}
    run_stages(cfg(**{"method.stages": ["make"]}), tmp_path, reg)
    cost = RunDir(tmp_path).stage_entry("make")["build_cost"]
    assert cost["encoder_wall_s"] >= 0.4 and cost["index_wall_s"] >= 0.2
    assert cost["overhead_share"] < 0.5, cost  # ~0.01: writing one tiny table
