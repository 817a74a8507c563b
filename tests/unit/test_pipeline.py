"""Pipeline plumbing: atomic tables, manifest last, skip by fingerprint, force, missing inputs."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import ClassVar

import polars as pl
import pytest
from omegaconf import OmegaConf

from structmem_gpu.config.settings import SIZE, Settings
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.errors import MissingTableError
from structmem_gpu.run.pipeline import config_hash, fingerprint, run_stages, stage_config
from structmem_gpu.stage import Stage, StageContext
from tests.fixtures.pipeline import compose_cfg

CALLS: list[str] = []


class MakeSettings(Settings):
    node: ClassVar[str] = "toy"
    n: SIZE


class DoubleSettings(Settings):
    node: ClassVar[str] = "toy"
    factor: SIZE


def _make(ctx: StageContext) -> dict[str, pl.DataFrame]:
    CALLS.append("make")
    return {"numbers": pl.DataFrame({"x": list(range(ctx.settings.n))})}


def _double(ctx: StageContext) -> dict[str, pl.DataFrame]:
    CALLS.append("double")
    df = ctx.read("numbers")
    return {"doubled": df.with_columns(y=pl.col("x") * ctx.settings.factor)}


def _broken(ctx: StageContext) -> dict[str, pl.DataFrame]:
    raise RuntimeError("stage crashed")


REGISTRY = {
    "make": Stage("make", _make, writes=("numbers",), settings=MakeSettings),
    "double": Stage("double", _double, reads=("numbers",), writes=("doubled",), settings=DoubleSettings),
    "broken": Stage("broken", _broken, reads=("numbers",), writes=("never",)),
}


@functools.lru_cache(maxsize=1)
def _composed():
    return compose_cfg(["paths.cache_dir=/nonexistent"])


def cfg(**over):
    """The packaged config (a valid job: the pipeline reads it as a JobConfig) running the
    toy stages, with `over` (dotted key -> value) set."""
    c = copy.deepcopy(_composed())
    OmegaConf.set_struct(c, False)
    OmegaConf.update(c, "method.stages", ["make", "double"])
    OmegaConf.update(c, "toy", {"n": 3, "factor": 2})
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
    a = config_hash(cfg(), REGISTRY)
    assert a == config_hash(cfg(**{"paths.cache_dir": "/else", "shard_index": 0, "num_shards": 4,
                                   "force": True}), REGISTRY)
    assert a != config_hash(cfg(**{"toy.factor": 3}), REGISTRY)


def test_manifest_records_settings_under_their_node(tmp_path: Path) -> None:
    run_stages(cfg(), tmp_path, REGISTRY)
    assert RunDir(tmp_path).stage_entry("double")["config"] == {"toy": {"factor": 2}}


# Launch and location knobs: never part of any stage's fingerprint.
EXCLUDED = ["llm.base_url=http://elsewhere:1", "llm.max_in_flight=3", "llm.request_timeout_s=7",
            "llm.startup_timeout_s=9", "llm.max_restarts=0", "paths.cache_dir=/else",
            "force=true", "stages=[load]", "dry_run=true", "preempt.grace_s=3", "num_shards=4",
            # how a server runs and reports, never what it replies (role "run", issue 40)
            "llm.progress=false", "llm.n_threads=1", "llm.max_retries=1", "llm.api_key_env=KEY",
            "llm.gpu_memory_utilization=0.5", "embedder.weights_gb=3"]


def _stages(overrides: list[str]) -> dict[str, Stage]:
    from structmem_gpu.methods.registry import stage_registry

    return dict(stage_registry(compose_cfg(overrides)))


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
@pytest.mark.parametrize("method", ["structmem", "seem", "graph_memory", "turn_rag"])
def test_excluded_keys_change_no_fingerprint(method: str) -> None:
    base = [f"method={method}", "judge=qwen2_5_32b"]
    stages = {n: s for n, s in _stages(base).items() if n != "load"}  # load: shards count (below)
    want = {n: stage_config(s, compose_cfg(base)) for n, s in stages.items()}
    for over in EXCLUDED + ["judge.llm.base_url=http://judge:2", "judge.llm.max_in_flight=1"]:
        other = compose_cfg([*base, over])
        assert {n: stage_config(s, other) for n, s in stages.items()} == want, over


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_settings_fields_and_dependencies_change_the_fingerprint(tmp_path: Path) -> None:
    stages = _stages([])
    cfg0 = compose_cfg([])
    changed = {
        # reply knobs (role "reply") change what the LLM stages get back: they rerun them
        "extract": ["extract.max_tokens=77", "llm.model=other", "prompts.reference_dir=/x",
                    "llm.request_seed=false", "llm.repair_attempts=2"],
        "consolidate": ["consolidate.seed_k=3", "embedder.model=other-encoder", "llm.revision=r2"],
        "retrieve": ["retrieve.entries_k=7", "benchmark.categories=[1,2]"],
        "answer": ["answer.max_tokens=33", "benchmark.categories=[1]", "llm.seed=5"],
        "judge": ["judge.max_tokens=9", "benchmark.categories=[2]", "judge.input=answer",
                  "llm.request_seed=false"],
        "report": ["report.bootstrap_seed=4", "method.stages=[load]"],
        "audit_extraction": ["audit.seed=3", "extract.context_turns=0"],
    }
    for name, overs in changed.items():
        for over in overs:
            assert stage_config(stages[name], compose_cfg([over])) != stage_config(stages[name], cfg0), (name, over)
    # Unrelated knobs leave a stage alone: retrieval budgets never re-run extraction.
    assert stage_config(stages["extract"], compose_cfg(["retrieve.entries_k=7"])) == stage_config(stages["extract"], cfg0)
    # The whole fingerprint (load reads no table): shards and the benchmark selection count.
    run = RunDir(tmp_path)
    load = stages["load"]
    fp = fingerprint(load, cfg0, run)
    assert fp == fingerprint(load, compose_cfg(["llm.base_url=http://x:1", "force=true"]), run)
    assert fp != fingerprint(load, compose_cfg(["num_shards=2"]), run)
    assert fp != fingerprint(load, compose_cfg(["benchmark.max_sessions=1"]), run)


def test_replace_requests_keeps_other_stages(tmp_path: Path) -> None:
    from structmem_gpu.core.schemas import REQUESTS, frame

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
