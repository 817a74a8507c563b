"""Nothing cached is lost: the configuration rewrites keep every response-cache key, and change
config hashes, fingerprints and run keys only where this docstring says so.

Response-cache keys (tests/fixtures/cache_keys_main_1a57fc9.json, computed on main 1a57fc9 by
the same function, before issue 40): the model id, the cache params and the key of one fixed
request, for the job's llm and every judge llm (judge.llm, judge.*_llm, judge.panel.N.llm) of
every configuration listed there: the representative jobs, every llm profile and every judge
preset. They must stay byte-identical, but for one deliberate change:
- `llm.repair_attempts` (role "reply": the cached reply is the repaired one) now enters the key
  when it is not 1, its default; at 1 it adds nothing, so every existing cache stays valid.
  (`llm.request_seed=false` entered it in issue 31, the same way.)
- the endpoint judges `gpt_4o_endpoint`, `gpt_4o_mini_endpoint` and `deepseek_v3_2_endpoint`
  send OpenAI's JSON mode (`llm.api_flavor=json_mode`, as the references' judges do; OpenAI
  refused the strict json_schema they sent, so no OpenAI-judged cache existed). An
  unconstrained reply is another reply: json_mode adds {"response_format": "json_object"} to
  their judge llm's cache params, so their judge keys moved; every other key is unchanged.

Config hashes, stage fingerprints, key lists and run keys (tests/fixtures/identity_issue40.json;
regenerate only for a deliberate change, and say it here:
`python -m tests.unit.test_identity_unchanged > tests/fixtures/identity_issue40.json`). Issue 40
changed them once, on purpose:
- every stage fingerprint and config hash: both are now the role-driven identity of the typed
  settings (config/identity.py, FINGERPRINT_VERSION 2), no longer the plain YAML, and the
  generated bases give every key of every group. Finished stages rerun once; their requests come
  from the response cache (keys above unchanged).
- the roles (config/schema.py): `llm.progress`, `api_key_env`, `max_retries`, `retry_backoff_s`,
  `n_threads`, `tensor_parallel_size`, `data_parallel_size`, `gpu_memory_utilization`,
  `max_num_seqs`, `server_python`, `vllm_entrypoint` are role "run" (how a server runs, never
  what it replies): they left every fingerprint, the config hash and the run-directory key
  (SERVING_KEYS lists them). `llm.request_seed` and `llm.repair_attempts` are role "reply": in
  every LLM stage's fingerprint (LLM_IDENTITY is now the whole "llm" node's identity).
Issue 41 changed one configuration's entry, on purpose:
- `llm=vllm_cpu`: its backend is `vllm_cpu` (llm/backends/vllm_cpu.py: vllm_server's command,
  nothing on a GPU), no longer `vllm_server`, so its config hash and LLM stage fingerprints
  moved; its response-cache key holds no backend and is unchanged (the test above).
Issue 44 changed every config hash, on purpose, and no stage fingerprint:
- the root `eval` node (config/schema.py EvalSettings: errata, cat5, judge_audit) is part of
  every job's identity, and every method maps the new `judge_audit` stage (conf/method/
  _answer.yaml), whose fingerprint is new. The answer and judge stages read `eval` only
  through their extra fingerprints, which are unchanged while eval.errata is null and
  eval.cat5 is rule (the defaults), so no finished stage reruns. Shard runs started before
  this change carry the old config hash: merge them with shards of the same version.
Issue 43 added two launch keys: `question_groups` and `group_plan` (run/groups.py) are role
"run", so LAUNCH_TOP_KEYS lists them and no hash moved for them. It also added
`extract.once_per_content` (role "result", off by default): every config hash and the
extract / audit_extraction fingerprints moved, on purpose. A finished extract stage reruns once
from the response cache (its request ids and entries are unchanged), writes the same entries
table, so every later stage's inputs hash as before and they do not rerun.
Issue 45 added `extract.reference_mode` (role "result", "event" by default: which official
prompt the fact perspective sends with prompts.sources.lightmem; "flat" in
experiment=flat_locomo_reference_code): the config hashes of the StructMem-family jobs (those
with an extract stage) and their extract / audit_extraction fingerprints moved, on purpose.
Without the LightMem texts the extract requests are unchanged: a finished extract stage reruns
once from the response cache and writes the same entries table.
Issue 56 added `answer.history_order` (role "result", "newest_first" by default: full_context's
history order; "flat" is StructMem Table 1's OpenAI row as Appendix A.4 describes it): every
config hash and every answer fingerprint moved, on purpose, and no other stage's. At the
default the answer requests are unchanged: a finished answer stage reruns once from the
response cache and writes the same answers table, so the judge and report do not rerun.
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

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CACHE_KEYS = json.loads((FIXTURES / "cache_keys_main_1a57fc9.json").read_text())
EXPECTED_PATH = FIXTURES / "identity_issue40.json"
EXPECTED = json.loads(EXPECTED_PATH.read_text()) if EXPECTED_PATH.exists() else {"configs": {}}

CONFIGS = [
    [], ["debug=scripted"], ["method=seem"], ["method=seem", "llm=vllm_server"],
    ["method=turn_rag", "llm=vllm_qwen2_5_7b", "embedder=bge_m3"], ["method=graph_memory"],
    ["method=full_context", "judge=panel_example"],
    ["method=flat", "llm=external", "llm.base_url=http://x:1/v1"],
    ["experiment=structmem_locomo", "llm=vllm_offline", "llm.model=m"],
    ["method=seem", "experiment=seem_longmemeval"],
    ["llm=vllm_cpu"], ["llm.request_seed=false"], ["llm.repair_attempts=2"],
]
OVERRIDES = ["debug=scripted", "consolidate.seed_k=5", "llm.base_url=http://x", "llm.max_in_flight=8",
             "paths.output_dir=/x", "cache.llm=false", "report.plots=false", "judge=gpt_4o_endpoint",
             "llm.request_seed=false", "embedder.weights_gb=3", "preempt.grace_s=5", "llm.seed=3",
             "method=seem", "llm.progress=false", "llm.repair_attempts=2", "llm.n_threads=1"]
REQUEST = LLMRequest(request_id="r1", stage="s", prompt_version="p/1",
                     messages=(Message("user", "hello"),), sampling=Sampling(max_tokens=16))

# The environment the fixtures were computed in: `benchmark.path` defaults to
# $STRUCTMEM_LOCOMO_PATH and is part of the config hash, so a CI clone elsewhere (another
# ../shared) would otherwise hash differently. None = unset.
FIXTURE_ENV = {
    "STRUCTMEM_LOCOMO_PATH": "/work/shared/data/locomo10.json",
    "STRUCTMEM_OFFICIAL_DIR": "/work/shared/official",
    "STRUCTMEM_ROOT": None, "STRUCTMEM_CACHE_DIR": None, "STRUCTMEM_VLLM_PYTHON": None,
    "OPENAI_BASE_URL": None,
}


def _set_env(values: dict[str, str | None]) -> None:
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _in_fixture_env(fn: Any) -> Any:
    # A hub model's weights version reads this machine's HF cache: keep it out of the comparison.
    import structmem_gpu.core.hf_cache as hf_cache

    saved = hf_cache.resolved_snapshot
    saved_env = {k: os.environ.get(k) for k in FIXTURE_ENV}
    hf_cache.resolved_snapshot = lambda repo, revision: None  # type: ignore[assignment]
    _set_env(FIXTURE_ENV)
    try:
        return fn()
    finally:
        hf_cache.resolved_snapshot = saved  # type: ignore[assignment]
        _set_env(saved_env)


def _backend_identity(llm: Any) -> dict[str, Any]:
    """model_id, cache_params and the fixed request's cache key of the HTTP backend an llm
    config builds."""
    from structmem_gpu.llm.factory import _http_backend, model_id, resolve_config

    c = resolve_config(llm)
    mid = model_id(c)
    params = _http_backend(c, "http://h/v1").cache_params
    return {"model_id": mid, "cache_params": params, "cache_key": cache_key(mid, REQUEST, params)}


def cache_identities(overrides: list[str]) -> dict[str, Any]:
    """The job's llm and every judge llm of the configuration, keyed as in the fixture."""
    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True)
    out = {"llm": _backend_identity(plain["llm"])}
    judge = plain.get("judge") or {}
    for key, value in judge.items():
        if (key == "llm" or key.endswith("_llm")) and value is not None:
            out[f"judge.{key}"] = _backend_identity(value)
    for i, member in enumerate(judge.get("panel") or []):
        if member.get("llm") is not None:
            out[f"judge.panel.{i}.llm"] = _backend_identity(member["llm"])
    return out


def _compute() -> dict[str, Any]:
    out: dict[str, Any] = {"configs": {}}
    for ov in CONFIGS:
        cfg = compose_cfg(ov)
        reg = stage_registry(OmegaConf.to_container(cfg, resolve=True))
        out["configs"][" ".join(ov)] = {
            "config_hash": config_hash(cfg),
            "stages": {name: stable_hash(stage_config(s, cfg)) for name, s in reg.items()},
        }
    out["LLM_IDENTITY"] = list(st.LLM_IDENTITY)
    out["EMBEDDER_IDENTITY"] = list(st.EMBEDDER_IDENTITY)
    out["SERVING_KEYS"] = sorted(rkeys.SERVING_KEYS)
    out["LAUNCH_TOP_KEYS"] = sorted(rkeys.LAUNCH_TOP_KEYS)
    out["ENCODER_PLAN_KEYS"] = sorted(rkeys.ENCODER_PLAN_KEYS)
    out["NO_TABLE_KEYS"] = sorted(rkeys.NO_TABLE_KEYS)
    out["run_key"] = {"run": rk.run_key(OVERRIDES, "run"), "sweep": rk.run_key(OVERRIDES, "sweep")}
    return out


def compute() -> dict[str, Any]:
    return _in_fixture_env(_compute)


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    return compute()


JSON_MODE_JUDGES = {"judge=gpt_4o_endpoint", "judge=gpt_4o_mini_endpoint",
                    "judge=deepseek_v3_2_endpoint"}


@pytest.mark.parametrize("config", sorted(CACHE_KEYS))
def test_response_cache_keys_unchanged(config: str) -> None:
    got = _in_fixture_env(lambda: cache_identities(config.split()))
    want = CACHE_KEYS[config]
    assert set(got) == set(want)
    for llm, ident in want.items():
        if config == "++llm.repair_attempts=2":  # the one deliberate change (docstring)
            assert got[llm]["cache_params"] == {**ident["cache_params"], "repair_attempts": 2}
            assert got[llm]["cache_key"] != ident["cache_key"]
            continue
        if config in JSON_MODE_JUDGES and llm == "judge.llm":  # deliberate (docstring)
            assert got[llm]["cache_params"] == {**ident["cache_params"],
                                                "response_format": "json_object"}
            assert got[llm]["cache_key"] != ident["cache_key"]
            assert got[llm]["model_id"] == ident["model_id"]
            continue
        assert got[llm] == ident, (config, llm)


@pytest.mark.parametrize("config", [" ".join(ov) for ov in CONFIGS])
def test_config_hash_and_stage_fingerprints_as_recorded(now: dict[str, Any], config: str) -> None:
    assert now["configs"][config] == EXPECTED["configs"][config]


def test_key_lists_and_run_keys_as_recorded(now: dict[str, Any]) -> None:
    for name in ("LLM_IDENTITY", "EMBEDDER_IDENTITY", "SERVING_KEYS", "LAUNCH_TOP_KEYS",
                 "ENCODER_PLAN_KEYS", "NO_TABLE_KEYS", "run_key"):
        assert now[name] == EXPECTED[name], name
    # How a server runs never names a run directory; what changes a reply always does.
    run = now["run_key"]["run"]
    assert "llm.progress" not in run and "llm.n_threads" not in run
    assert "llm.repair_attempts=2" in run and "llm.request_seed=false" in run


if __name__ == "__main__":
    json.dump(compute(), sys.stdout, indent=1, sort_keys=True)
    print()
