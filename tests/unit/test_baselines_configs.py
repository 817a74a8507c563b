"""Ablation and experiment configs: w/o cross-event == structmem with consolidation off; the
paradigms/baselines multiruns sweep exactly their methods with everything else fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.structmem import consolidate, embed, extract
from structmem_gpu.config.run_key import run_key
from tests.unit.test_structmem_stages import FakeBackends, cfg_for, echo, run_stage

CONF = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = {
    "paradigms": ["flat", "graph_memory", "structmem_no_cross_event", "structmem"],
    "baselines": ["full_context", "turn_rag", "flat", "structmem"],
}


def _plain(*overrides: str) -> dict:
    out = OmegaConf.to_container(cfg_for(*overrides), resolve=True)
    assert isinstance(out, dict)
    out["method"].pop("name")
    return out


def test_no_cross_event_equals_structmem_with_consolidation_off() -> None:
    assert _plain("method=structmem_no_cross_event") == _plain(
        "method=structmem", "consolidate.enabled=false"
    )


def test_no_cross_event_sends_no_synthesis_request(tmp_path: Path, sample_path: Path) -> None:
    turns, questions = load_benchmark("sample", sample_path, None, None)
    run = RunDir(tmp_path / "run")
    run.write_table("turns", turns)
    run.write_table("questions", questions)
    cfg, backends = cfg_for("method=structmem_no_cross_event"), FakeBackends({"extract": echo})
    run_stage(run, cfg, backends, extract.STAGE)
    run_stage(run, cfg, backends, embed.STAGE)
    before = backends.scripted.calls
    ctx = run_stage(run, cfg, backends, consolidate.STAGE)
    assert backends.scripted.calls == before and ctx.batches == 0 and not ctx.request_frames
    assert (
        run.read_table("syntheses").height == 0
        and run.read_table("synthesis_embeddings").height == 0
    )
    assert set(run.read_table("entries")["kind"]) == {"fact", "relation"}  # both perspectives kept


def _experiment(name: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(
            config_name="config", overrides=[f"experiment={name}"], return_hydra_config=True
        )


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_experiment_sweeps_its_methods_and_nothing_else(name: str) -> None:
    cfg = _experiment(name)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert params == {"method": ",".join(EXPERIMENTS[name])}
    sweep = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)
    assert sweep["subdir"] == "${run_key:sweep,${hydra.overrides.task}}"
    # one subdir per method: the sweep key keeps `method`
    subdirs = {run_key([f"experiment={name}", f"method={m}"], "sweep") for m in EXPERIMENTS[name]}
    assert len(subdirs) == len(EXPERIMENTS[name])
    base = _plain()
    for method in EXPERIMENTS[name]:
        c = _plain(f"experiment={name}", f"method={method}")
        assert all(c[k] == base[k] for k in ("llm", "embedder", "judge", "index"))
        # the rows they are compared with are LoCoMo's (StructMem Table 2): pinned, not the sample
        assert c["benchmark"]["name"] == "locomo"
        mcfg = cfg_for(f"method={method}")
        stages = stage_registry(mcfg)
        assert all(s in stages for s in mcfg.method.stages), method


def test_experiment_headers_name_the_command() -> None:
    for name in EXPERIMENTS:
        text = (CONF / "experiment" / f"{name}.yaml").read_text()
        assert (
            text.startswith("# @package _global_")
            and f"python jobs/run.py -m experiment={name}" in text
        )


# experiment=structmem_table1: each point (conf/table1/<name>.yaml) -> its method, the A.4 knob
# it sets, and the StructMem Table 1 row it is the configuration of (docs/evaluation.md
# "StructMem Table 1 and Table 4 rows")
TABLE1 = {
    "structmem": ("structmem", {}, "structmem-table1"),
    "openai": ("full_context", {"answer.context_tokens": None, "answer.history_order": "flat"},
               "structmem-table1-openai"),
    "full_context": ("full_context", {"answer.context_tokens": None,
                                      "answer.history_order": "newest_first"},
                     "structmem-table1-full-context"),
    "minirag": ("minirag", {"system.top_k": 20}, "structmem-table1-minirag"),
    "lightrag": ("lightrag", {"system.top_k": 20}, "structmem-table1-lightrag"),
    "langmem": ("langmem", {"system.top_k": 40}, "structmem-table1-langmem"),
    "amem": ("amem", {"system.top_k": 40}, "structmem-table1-a-mem"),
    "mem0": ("mem0", {"system.top_k": 10}, "structmem-table1-mem0"),
    "memoryos": ("memoryos", {"system.top_k": 10, "system.options": None},
                 "structmem-table1-memoryos"),
    "mem0_graph": ("mem0_graph", {"system.top_k": 10}, "structmem-table1-mem0-graph"),
    "zep": ("zep", {"system.top_k": 10}, "structmem-table1-zep"),
}


def test_structmem_table1_sweeps_every_runnable_row_with_its_a4_setting() -> None:
    from structmem_gpu.eval.published import load_published, match_note

    cfg = _experiment("structmem_table1")
    assert OmegaConf.to_container(cfg.hydra.sweeper.params) == {"+table1": ",".join(TABLE1)}
    assert sorted(p.stem for p in (CONF / "table1").glob("*.yaml")) == sorted(TABLE1)
    rows = [r for r in load_published() if r.match and r.id.startswith("structmem-table1")]
    shared = None
    for point, (method, knobs, row_id) in TABLE1.items():
        # a research profile: a debug profile's run never matches a published row
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            c = compose(config_name="config", overrides=[
                "experiment=structmem_table1", f"+table1={point}", "llm=vllm_qwen2_5_7b"])
        assert c.method.name == method and list(c.benchmark.categories) == [1, 2, 3, 4], point
        for key, value in knobs.items():
            assert OmegaConf.select(c, key) == value, (point, key)
        assert [r.id for r in rows if match_note(c, r) is not None] == [row_id], point
        same = {k: OmegaConf.to_container(c[k], resolve=True) for k in ("llm", "judge", "prompts")}
        assert same == (shared := shared or same), point  # one answer model, judge and texts
    # every runnable Table 1 row is a point; Memobase is excluded (hosted server)
    assert {r.id for r in rows} == {row for _, _, row in TABLE1.values()}
