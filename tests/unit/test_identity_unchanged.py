"""The typed-configuration rewrite (issue 31) must keep every identity: config hashes, stage
fingerprints' config part, model ids, response-cache keys and run-directory keys of a few
representative configurations are compared with values computed on main ce7ff4e, before the
rewrite (tests/fixtures/identity_main_ce7ff4e.json; regenerate only for a deliberate change:
`python -m tests.unit.test_identity_unchanged > tests/fixtures/identity_main_ce7ff4e.json`).

Two deliberate changes (issue 31):
- `llm.request_seed=false` now enters the response-cache key (its replies differ from seeded
  ones); the default (true) adds nothing, so existing caches stay valid.
- the CPU profile's llm.budgets.answer_max_tokens (48) now reaches the seem, turn_rag and
  full_context readers (96 before): their answer stage and config hash change on that profile
  only (no other profile sets the budget; GPU profiles keep 96).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from structmem_gpu import stage as st
from structmem_gpu.config import result_keys as rkeys
from structmem_gpu.config import run_key as rk
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.llm.dedup import cache_key
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import config_hash, stage_config
from tests.fixtures.pipeline import compose_cfg

EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "identity_main_ce7ff4e.json"

CONFIGS = [
    [], ["debug=scripted"], ["method=seem"], ["method=seem", "llm=vllm_server"],
    ["method=turn_rag", "llm=vllm_qwen2_5_7b", "embedder=bge_m3"], ["method=graph_memory"],
    ["method=full_context", "judge=panel_example"],
    ["method=flat", "llm=external", "llm.base_url=http://x:1/v1"],
    ["experiment=structmem_locomo", "llm=vllm_offline", "llm.model=m"],
    ["method=seem", "experiment=seem_longmemeval"],
    ["llm=vllm_cpu"], ["++llm.request_seed=false"],
]
OVERRIDES = ["debug=scripted", "consolidate.seed_k=5", "llm.base_url=http://x", "llm.max_in_flight=8",
             "paths.output_dir=/x", "cache.llm=false", "report.plots=false", "judge=gpt_4o_endpoint",
             "llm.request_seed=false", "embedder.weights_gb=3", "preempt.grace_s=5", "llm.seed=3",
             "method=seem"]
REQUEST = LLMRequest(request_id="r1", stage="s", prompt_version="p/1",
                     messages=(Message("user", "hello"),), sampling=Sampling(max_tokens=16))


def _backend_identity(cfg: Any) -> tuple[str, dict[str, Any]]:
    """(model_id, cache_params) of the HTTP backend the job's llm config builds."""
    from structmem_gpu.llm.factory import _http_backend, model_id, resolve_config

    c = resolve_config(cfg.llm)
    return model_id(c), _http_backend(c, "http://h/v1").cache_params


# The environment the fixture was computed in: `benchmark.path` defaults to
# $STRUCTMEM_LOCOMO_PATH and is part of the config hash, so a CI clone elsewhere (another
# ../shared) would otherwise hash differently. None = unset.
FIXTURE_ENV = {
    "STRUCTMEM_LOCOMO_PATH": "/work/shared/data/locomo10.json",
    "STRUCTMEM_OFFICIAL_DIR": "/work/shared/official",
    "STRUCTMEM_ROOT": None, "STRUCTMEM_CACHE_DIR": None, "STRUCTMEM_VLLM_PYTHON": None,
}


def compute() -> dict[str, Any]:
    # A hub model's weights version reads this machine's HF cache: keep it out of the comparison.
    import structmem_gpu.core.hf_cache as hf_cache

    saved = hf_cache.resolved_snapshot
    saved_env = {k: os.environ.get(k) for k in FIXTURE_ENV}
    hf_cache.resolved_snapshot = lambda repo, revision: None  # type: ignore[assignment]
    _set_env(FIXTURE_ENV)
    try:
        return _compute()
    finally:
        hf_cache.resolved_snapshot = saved  # type: ignore[assignment]
        _set_env(saved_env)


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _compute() -> dict[str, Any]:
    out: dict[str, Any] = {"configs": {}}
    for ov in CONFIGS:
        cfg = compose_cfg(ov)
        reg = stage_registry(OmegaConf.to_container(cfg, resolve=True))
        mid, params = _backend_identity(cfg)
        out["configs"][" ".join(ov)] = {
            "config_hash": config_hash(cfg),
            "stages": {name: stable_hash(stage_config(s, cfg)) for name, s in reg.items()},
            "model_id": mid, "cache_params": params, "cache_key": cache_key(mid, REQUEST, params),
        }
    out["LLM_IDENTITY"] = list(st.LLM_IDENTITY)
    out["EMBEDDER_IDENTITY"] = list(st.EMBEDDER_IDENTITY)
    out["SERVING_KEYS"] = sorted(rkeys.SERVING_KEYS)
    out["LAUNCH_TOP_KEYS"] = sorted(rkeys.LAUNCH_TOP_KEYS)
    out["ENCODER_PLAN_KEYS"] = sorted(rkeys.ENCODER_PLAN_KEYS)
    out["NO_TABLE_KEYS"] = sorted(rkeys.NO_TABLE_KEYS)
    out["run_key"] = {"run": rk.run_key(OVERRIDES, "run"), "sweep": rk.run_key(OVERRIDES, "sweep")}
    return out


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return compute()


EXPECTED_DATA = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {"configs": {}}


# CPU-profile configs of a short-answer reader: the answer budget now reaches it (48, not 96).
ANSWER_BUDGET_CHANGED = {"method=seem", "method=seem experiment=seem_longmemeval",
                         "method=full_context judge=panel_example"}


@pytest.mark.parametrize("config", sorted(EXPECTED_DATA["configs"]))
def test_config_hash_and_stage_fingerprints_unchanged(now: dict[str, Any], config: str) -> None:
    want, got = EXPECTED_DATA["configs"][config], now["configs"][config]
    assert got["model_id"] == want["model_id"]
    if config in ANSWER_BUDGET_CHANGED:
        assert got["config_hash"] != want["config_hash"]
        changed = {k for k in want["stages"] if got["stages"][k] != want["stages"][k]}
        assert changed == {"answer"} and set(got["stages"]) == set(want["stages"])
        return
    assert got["config_hash"] == want["config_hash"]
    assert got["stages"] == want["stages"]


@pytest.mark.parametrize("config", sorted(EXPECTED_DATA["configs"]))
def test_response_cache_key_unchanged_except_unseeded(now: dict[str, Any], config: str) -> None:
    want, got = EXPECTED_DATA["configs"][config], now["configs"][config]
    if "llm.request_seed=false" in config or config == "llm=vllm_cpu":  # both send no seed
        assert got["cache_key"] != want["cache_key"]
        assert got["cache_params"] == {**want["cache_params"], "request_seed": False}
    else:
        assert got["cache_params"] == want["cache_params"]
        assert got["cache_key"] == want["cache_key"]


def test_key_lists_and_run_keys_unchanged(now: dict[str, Any]) -> None:
    for name in ("LLM_IDENTITY", "EMBEDDER_IDENTITY", "SERVING_KEYS", "LAUNCH_TOP_KEYS",
                 "ENCODER_PLAN_KEYS", "NO_TABLE_KEYS", "run_key"):
        assert now[name] == EXPECTED_DATA[name], name


if __name__ == "__main__":
    json.dump(compute(), sys.stdout, indent=1, sort_keys=True)
    print()
