"""Adding a backend or a stage is one module (issue 41): a fixture backend registered from this
test module alone is planned by the GPU plan, checked by the preflight, context-guarded by the
factory and counted by the dry run; a fixture stage marked per-question is costed per question.
Nothing outside this file names either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from structmem_gpu.core.stage_parts import QUESTION
from structmem_gpu.llm.backends import Backend, backend, names, registered
from structmem_gpu.llm.backends.spec import EngineProblem
from structmem_gpu.stage import Stage
from tests.fixtures.pipeline import compose_job

FIXTURE = "fixture_engine"


class FixtureEngine(Backend):
    """A launched GPU engine with its own context knob, token counter and engine check."""

    name = FIXTURE
    launches = True
    gpu_kind = "fixture engine"
    http = False

    def engine_problem(self, s: Any, key: str) -> EngineProblem | None:
        return EngineProblem("the fixture engine is not installed", "pip install fixture-engine")

    def token_counter(self, s: Any) -> Any:
        from structmem_gpu.llm.prompt_counter import TokenCounter

        # One token per word: a count no packaged counter gives.
        return TokenCounter("fixture:words",
                            lambda msgs: sum(len(m.content.split()) for m in msgs))

    def open(self, s: Any, ctx: Any) -> Any:
        from structmem_gpu.llm.scripted import ScriptedLLM

        return ScriptedLLM(model_id=ctx.model_id, repair_attempts=s.repair_attempts)


@pytest.fixture
def fixture_backend() -> Iterator[Backend]:
    with registered(FixtureEngine) as spec:
        yield spec


OVERRIDES = [f"llm.backend={FIXTURE}", "llm.model=fixture/model-7b", "llm.weights_gb=14",
             "llm.max_model_len=300", "gpu.memory_gb=80"]


def _stages(job: Any) -> list[Stage]:
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import job_stage_names

    registry = stage_registry(job)
    return [registry[n] for n in job_stage_names(job) if n in registry]


def test_an_unregistered_backend_is_refused_naming_the_registered_ones() -> None:
    from structmem_gpu.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"llm.backend='fixture_engine': unknown llm.backend .*registered: external, llamacpp"):
        compose_job([f"llm.backend={FIXTURE}"])
    assert {"llamacpp", "vllm_server", "vllm_cpu", "vllm_offline", "external", "scripted"} <= set(names())


def test_gpu_plan_places_the_fixture_backend(fixture_backend: Backend) -> None:
    from structmem_gpu.node.gpu_plan import plan

    job = compose_job(OVERRIDES)
    text = plan(job, _stages(job)).format()
    assert "llm (fixture engine fixture/model-7b) 72.0 GB = share 0.90 [weights 14.0 GB by preset weights_gb" in text


def test_preflight_checks_the_fixture_engine(fixture_backend: Backend, tmp_path: Path) -> None:
    from structmem_gpu.node import preflight

    job = compose_job(OVERRIDES)
    found = preflight.check_engines(preflight.Job(job, _stages(job), tmp_path))
    assert [f.line() for f in found] == [
        f"answer LLM (llm.backend={FIXTURE}): the fixture engine is not installed; fix: pip install fixture-engine"]
    models = [r.name for r in preflight.named_models(job, _stages(job))]
    assert "fixture/model-7b" in models  # its weights are fetched and checked like any launched model


def test_factory_guards_the_fixture_backends_context(fixture_backend: Backend, tmp_path: Path) -> None:
    from structmem_gpu.llm.context_guard import OVER_CONTEXT
    from structmem_gpu.llm.factory import open_llm
    from structmem_gpu.llm.types import LLMRequest, Message, Sampling

    job = compose_job(OVERRIDES)
    long = LLMRequest(request_id="long", stage="answer", prompt_version="t/1",
                      messages=(Message("user", "word " * 1200),), sampling=Sampling(max_tokens=16))
    short = LLMRequest(request_id="short", stage="answer", prompt_version="t/1",
                       messages=(Message("user", "a short question"),), sampling=Sampling(max_tokens=16))
    with open_llm(job.root.llm, log_dir=tmp_path, cache_dir=None) as llm:
        got = {r.request_id: r for r in llm.generate([long, short])}
    assert got["long"].finish_reason == OVER_CONTEXT and "llm.max_model_len" in got["long"].error
    assert got["short"].finish_reason != OVER_CONTEXT


def test_dry_run_counts_with_the_fixture_backends_counter(fixture_backend: Backend) -> None:
    from structmem_gpu.node.dry_run import estimate

    est = estimate(compose_job(OVERRIDES))
    assert est["tokenizer"] == "fixture:words"
    assert est["context"]["tokens"] == 300 and est["context"]["source"] == "llm.max_model_len"
    assert est["total"]["prompt_tokens"] > 0


# ---- a fixture stage: per question by its own declaration ------------------------------------


def _rerank(ctx: Any) -> dict[str, pl.DataFrame]:  # never run here: the cost readers only
    raise AssertionError("not run")


FIXTURE_STAGE = Stage(name="fixture_rerank", run=_rerank, reads=("entries",), part=QUESTION,
                      uses=("llm",))


def _finished_run(tmp_path: Path) -> Path:
    """A run directory as the pipeline leaves it: the saved config names the fixture stage."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "tables").mkdir()
    impl = {"load": "structmem_gpu.methods.load:STAGE", "extract": "structmem_gpu.methods.structmem.extract:STAGE",
            "fixture_rerank": f"{__name__}:FIXTURE_STAGE", "answer": "structmem_gpu.eval.answer:STAGE"}
    stages = ["load", "extract", "fixture_rerank", "answer"]
    (run / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"method": {"name": "fixture", "stages": stages, "implementations": impl}}))
    rows = [("extract", 4), ("fixture_rerank", 3), ("answer", 3)]
    pl.DataFrame({
        "request_id": [f"{s}-{i}" for s, n in rows for i in range(n)],
        "stage": [s for s, n in rows for _ in range(n)],
        "conv_id": ["c1"] * 10, "cache_hit": [False] * 10,
        "prompt_tokens": [100] * 10, "completion_tokens": [10] * 10,
        "cached_tokens": pl.Series([None] * 10, dtype=pl.Int64), "finish_reason": ["stop"] * 10,
    }).write_parquet(run / "tables" / "requests.parquet")
    pl.DataFrame({"question_id": ["q1", "q2", "q3"]}).write_parquet(run / "tables" / "answers.parquet")
    manifest = {"stages": {s: {"build_cost": {"calls": n, "prompt_tokens": 100 * n,
                                              "completion_tokens": 10 * n, "wall_s": 1.0}}
                           for s, n in rows}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_a_per_question_stage_is_costed_per_question(tmp_path: Path) -> None:
    from structmem_gpu.analysis.compare import build_cost
    from structmem_gpu.bench.cost import cost_report

    run = _finished_run(tmp_path)
    basis = {r["stage"]: r["basis"] for r in cost_report(run)["extrapolation"]["per_stage"]}
    assert basis == {"extract": "turns", "fixture_rerank": "questions", "answer": "questions"}
    # ... and is not memory-building cost in the comparison table
    cost = build_cost(json.loads((run / "manifest.json").read_text()), run)
    assert (cost["build_calls"], cost["build_prompt_tokens"]) == (4, 400)


def test_stage_order_and_parts_come_from_the_saved_method(tmp_path: Path) -> None:
    from structmem_gpu.stage_lookup import RunStages

    stages = RunStages(_finished_run(tmp_path))
    assert stages.order == ("load", "extract", "fixture_rerank", "answer")
    assert [stages.part(n) for n in stages.order] == ["input", "build", "question", "question"]
    assert stages.part("never_declared") == "build"  # an unknown stage's cost is counted, not dropped


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_the_manifest_records_each_stage_part_for_readers_that_import_no_stage(tmp_path: Path) -> None:
    from structmem_gpu.stage_lookup import RunStages
    from tests.fixtures.pipeline import run_pipeline

    run = tmp_path / "sample"
    run_pipeline(["debug=scripted", "stages=[load,extract,embed,consolidate,retrieve,answer,judge,report]"], run)
    recorded = {n: e["part"] for n, e in json.loads((run / "manifest.json").read_text())["stages"].items()}
    assert recorded == {"load": "input", "extract": "build", "embed": "build", "consolidate": "build",
                        "retrieve": "question", "answer": "question", "judge": "question",
                        "report": "report"}
    # A stage the saved config can no longer import keeps the part its run recorded.
    saved = run / ".hydra" / "config.yaml"
    saved.parent.mkdir(exist_ok=True)
    saved.write_text(yaml.safe_dump({"method": {"stages": ["load", "retrieve"], "implementations": {
        "retrieve": "structmem_gpu.methods.moved_away:STAGE"}}}))
    assert RunStages(run).part("retrieve") == "question"


def test_every_packaged_stage_states_or_implies_its_part() -> None:
    from structmem_gpu.stage_lookup import packaged_stages

    parts = {n: s.kind for n, s in packaged_stages().items()}
    assert parts["load"] == "input" and parts["report"] == "report"
    assert {parts[n] for n in ("retrieve", "answer", "judge")} == {"question"}
    assert {parts[n] for n in ("audit_extraction", "audit_consolidation")} == {"audit"}
    assert {parts[n] for n in ("extract", "embed", "consolidate", "frames", "fusion", "graph",
                               "compress", "segment", "update")} == {"build"}


def test_backend_names_its_own_module() -> None:
    import structmem_gpu.llm.backends as pkg

    for name in names():
        assert type(backend(name)).__module__ == f"{pkg.__name__}.{name}"
