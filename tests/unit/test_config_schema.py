"""Typed, range-checked configuration: every packaged config is valid and fully covered by the
typed settings; every bad value is one ConfigError line naming the key, before any stage runs."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from structmem_gpu.config import schema as config_schema
from structmem_gpu.config.settings import external, fields, sub_model
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.registry import stage_registry
from tests.fixtures.pipeline import compose_cfg, options

ROOT = Path(__file__).resolve().parents[2]
GROUPS = ("benchmark", "method", "llm", "embedder", "index", "judge", "audit", "debug",
          "experiment", "paths", "tracking")


def _job_stages(cfg: dict) -> list:
    return list(stage_registry(cfg).values())


@functools.lru_cache(maxsize=1)
def _all_stages() -> list:
    """Every stage of every packaged method (what a key no job's method reads must be typed by)."""
    out = []
    for name in options("method"):
        cfg = OmegaConf.to_container(compose_cfg([f"method={name}"]), resolve=True)
        out += [s for s in _job_stages(cfg) if s not in out]
    return out


def problems(cfg: dict) -> list[str]:
    return config_schema.problems(cfg, _job_stages(cfg))


def check_config(cfg) -> None:
    plain = OmegaConf.to_container(cfg, resolve=True)
    config_schema.check_config(cfg, stage_registry(plain).values())


def _options() -> list[str]:
    out = []
    for group in GROUPS:
        out += [f"{group}={name}" for name in options(group)]
    return out


@pytest.mark.parametrize("choice", _options())
def test_every_packaged_config_is_valid_and_every_key_has_a_rule(choice: str) -> None:
    cfg = OmegaConf.to_container(compose_cfg([choice]), resolve=True)
    assert isinstance(cfg, dict)
    # A key the job's own stages do not read (audit under method=seem, seem.* that debug=ci
    # sets for every method) must still be a typed field of some stage's settings.
    uncovered = config_schema.uncovered(cfg, _all_stages())
    assert not uncovered, f"{choice}: keys without a typed settings field: {uncovered}"
    assert problems(cfg) == [], choice


def test_a_key_without_a_typed_field_is_found() -> None:
    cfg = OmegaConf.to_container(compose_cfg(["judge=panel_example"]), resolve=True)
    cfg["extract"]["new_knob"] = 1
    cfg["llm"]["budgets"]["new_budget"] = 2
    cfg["judge"]["panel"][1]["llm"]["new_engine_arg"] = 3
    assert config_schema.uncovered(cfg, _all_stages()) == [
        "extract.new_knob", "llm.budgets.new_budget", "judge.panel.1.llm.new_engine_arg"]


@pytest.mark.parametrize("method", options("method"))
def test_every_dependency_of_a_stage_is_a_typed_key_of_its_job(method: str) -> None:
    """What a stage depends on outside its node is checked by the job's models too."""
    cfg = OmegaConf.to_container(compose_cfg([f"method={method}"]), resolve=True)
    stages = _job_stages(cfg)
    models = [config_schema.JobSettings, *(s.settings for s in stages if s.settings)]
    for stage in stages:
        for key in stage.depends:
            assert any(_declares(m, key) for m in models), (stage.name, key)


def _declares(model, key: str, nested: bool = False) -> bool:
    """Whether `key` (dotted, from the config root) is a field of `model` at its node."""
    if model.node and not nested:
        if not key.startswith(model.node + "."):
            return key == model.node
        key = key[len(model.node) + 1:]
    head, _, rest = key.partition(".")
    field = fields(model).get(head)
    if field is None or external(field):
        return False
    inner = sub_model(field)
    return not rest or (inner is not None and _declares(inner, rest, nested=True))


BAD = [
    # (overrides, key named in the error, a word of what is allowed)
    (["num_shards=0"], "num_shards", ">= 1"),
    (["num_shards=2", "shard_index=2"], "shard_index", "num_shards"),
    (["force=maybe"], "force", "true or false"),
    (["cache.llm=yes"], "cache.llm", "true or false"),
    (["preempt.grace_s=-1"], "preempt.grace_s", ">= 0"),
    (["report.max_parse_failure_rate=1.5"], "report.max_parse_failure_rate", "<= 1"),
    (["benchmark.max_sessions=0"], "benchmark.max_sessions", ">= 1"),
    (["benchmark.categories=[0,1]"], "benchmark.categories", "list of an integer >= 1"),
    (["consolidate.seed_k=abc"], "consolidate.seed_k", "an integer >= 0"),
    (["consolidate.window_seconds=0"], "consolidate.window_seconds", "> 0"),
    (["consolidate.seed_scope=future"], "consolidate.seed_scope", "'historical', 'global'"),
    (["consolidate.query_mode=sum"], "consolidate.query_mode", "'concat', 'mean'"),
    (["retrieve.entries_k=-5"], "retrieve.entries_k", ">= 0"),
    (["extract.max_tokens=0"], "extract.max_tokens", ">= 1"),
    (["extract.turns_per_request=0"], "extract.turns_per_request", ">= 1"),
    (["extract.perspectives=[facts]"], "extract.perspectives", "'fact', 'relation'"),
    (["extract.window_tokens=0"], "extract.window_tokens", ">= 1"),
    (["extract.prompt_variant=strict"], "extract.prompt_variant", "'default', 'grounded'"),
    (["consolidate.seed_exclude_buffer=2"], "consolidate.seed_exclude_buffer", "true or false"),
    (["embedder.long_texts=cut"], "embedder.long_texts", "'chunk', 'truncate'"),
    (["llm.budgets.extract_max_items=0"], "llm.budgets.extract_max_items", ">= 1"),
    (["llm.budgets.extract_max_item_chars=0"], "llm.budgets.extract_max_item_chars", ">= 1"),
    (["llm.budgets.reader_entries_k=-1"], "llm.budgets.reader_entries_k", ">= 0"),
    (["answer.max_tokens=-1"], "answer.max_tokens", ">= 1"),
    (["answer.protocol=strict"], "answer.protocol", "'paper', 'reasoned'"),
    (["judge.protocol=lenient"], "judge.protocol", "'paper', 'reasoned'"),
    (["method=graph_memory", "graph_memory.entity_threshold=1.5"],
     "graph_memory.entity_threshold", "<= 1"),
    (["method=seem", "seem.retrieve.damping=0"], "seem.retrieve.damping", "> 0"),
    (["method=seem", "seem.fusion.window=0"], "seem.fusion.window", ">= 1"),
    (["method=seem", "seem.ablation.ppr=maybe"], "seem.ablation.ppr", "true or false"),
    (["method=seem", "seem.retrieve.p_ret_k=-1"], "seem.retrieve.p_ret_k", ">= 0"),
    (["llm.max_in_flight=0"], "llm.max_in_flight", ">= 1"),
    (["llm.backend=openai"], "llm.backend", "registered: external, llamacpp, scripted, vllm_cpu"),
    (["llm.max_restarts=-1"], "llm.max_restarts", ">= 0"),
    (["llm.request_timeout_s=0"], "llm.request_timeout_s", "> 0"),
    (["embedder.batch_size=0"], "embedder.batch_size", ">= 1"),
    (["index.use_gpu=sometimes"], "index.use_gpu", "'auto', True, False"),
    (["judge.max_tokens=0"], "judge.max_tokens", ">= 1"),
    (["judge.temperature=-1"], "judge.temperature", ">= 0"),
    (["judge=qwen2_5_32b", "judge.llm.max_in_flight=0"], "judge.llm.max_in_flight", ">= 1"),
    (["audit.extraction.sample_size=0"], "audit.extraction.sample_size", ">= 1"),
    (["audit.consolidation.max_links=0"], "audit.consolidation.max_links", ">= 1"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD, ids=[b[1] for b in BAD])
def test_bad_value_is_one_error_naming_key_value_and_what_is_allowed(
    overrides: list[str], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check_config(compose_cfg(overrides))
    msg = str(err.value)
    # The key itself, or (budgets read through ${llm.budgets.*}) the key it feeds, comes first.
    assert msg.startswith("config ") and f" {key}=" in msg, msg
    assert allowed in msg and "\n" not in msg


def test_several_bad_values_are_all_counted() -> None:
    with pytest.raises(ConfigError, match=r"and 2 more"):
        check_config(compose_cfg(["retrieve.entries_k=-5", "extract.max_tokens=0",
                                  "consolidate.seed_k=abc"]))


def test_panel_member_llm_configs_are_checked() -> None:
    cfg = OmegaConf.to_container(compose_cfg(["judge=panel_example"]), resolve=True)
    assert isinstance(cfg, dict)
    cfg["judge"]["panel"][1]["llm"]["max_in_flight"] = 0
    assert any(p.startswith("judge.panel.1.llm.max_in_flight=0") for p in problems(cfg))


@pytest.mark.e2e  # e2e: job subprocesses
@pytest.mark.parametrize("override", ["consolidate.seed_k=abc", "retrieve.entries_k=-5",
                                      "consolidate.window_seconds=0", "extract.max_tokens=0"])
def test_job_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, override: str) -> None:
    run_dir = tmp_path / "run"
    job = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "run.py"), "debug=scripted", override,
         f"hydra.run.dir={run_dir}", f"paths.cache_dir={tmp_path / 'cache'}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert job.returncode == 2, job.stderr[-2000:]
    errors = [ln for ln in job.stderr.splitlines() if ln.startswith("error:")]
    key = override.split("=")[0]
    assert len(errors) == 1 and errors[0].startswith(f"error: config {key}="), job.stderr
    assert "Traceback" not in job.stderr
    assert not (run_dir / "tables").exists() and not (run_dir / "manifest.json").exists()
