"""Backends scoped to the stages that use them (Stage.uses): released once no remaining stage
of the job uses them, opened again when needed; a judge on the answer model shares its
backend; undeclared roles are refused; a plan that cannot fit stops the job first."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.errors import GpuPlanError
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import run_stages
from structmem_gpu.stage import ROLES, Stage, StageContext
from tests.fixtures.pipeline import compose_cfg

SEEN: list[tuple[str, list[str]]] = []


def _stage(name: str, uses: tuple[str, ...], act) -> Stage:
    def run(ctx: StageContext) -> dict[str, pl.DataFrame]:
        SEEN.append((name, sorted(ctx.backends.open_keys())))  # open when the stage starts
        act(ctx)
        return {}

    return Stage(name=name, run=run, uses=uses)


def _llm(ctx: StageContext) -> None:
    ctx.llm()


def _judges(ctx: StageContext) -> None:
    ctx.backends.judges()


def _encoder(ctx: StageContext) -> None:
    ctx.encoder()


def run_toy(tmp_path: Path, stages: list[Stage], *overrides: str) -> list[tuple[str, list[str]]]:
    cfg = compose_cfg(["debug=scripted", "embedder=minilm", f"paths.cache_dir={tmp_path / 'c'}",
                       "stages=[" + ",".join(s.name for s in stages) + "]", *overrides])
    SEEN.clear()
    run_stages(cfg, tmp_path / "run", {s.name: s for s in stages})
    return list(SEEN)


def test_separate_judge_starts_after_the_answer_backend_left(tmp_path: Path) -> None:
    stages = [_stage("build", ("llm",), _llm), _stage("answer", ("llm",), _llm),
              _stage("judge", ("judges",), _judges)]
    seen = run_toy(tmp_path, stages, "judge=qwen2_5_32b")
    assert seen == [("build", []), ("answer", ["llm"]), ("judge", [])]


def test_judge_on_the_answer_model_reuses_its_backend(tmp_path: Path) -> None:
    stages = [_stage("answer", ("llm",), _llm), _stage("judge", ("judges",), _judges)]
    assert run_toy(tmp_path, stages, "judge=same_as_llm") == [("answer", []), ("judge", ["llm"])]


def test_panel_with_the_answer_model_stays_co_resident(tmp_path: Path) -> None:
    stages = [_stage("answer", ("llm",), _llm), _stage("judge", ("judges",), _judges),
              _stage("after", (), lambda ctx: None)]
    seen = run_toy(tmp_path, stages, "judge=panel_example")
    assert seen == [("answer", []), ("judge", ["llm"]), ("after", [])]


def test_encoder_released_after_its_last_stage_and_reopened_when_needed(tmp_path: Path) -> None:
    stages = [_stage("embed", ("encoder",), _encoder), _stage("answer", ("llm",), _llm),
              _stage("retrieve", ("encoder",), _encoder), _stage("judge", ("judges",), _judges)]
    seen = run_toy(tmp_path, stages)
    # encoder kept across answer (retrieve needs it), gone once no later stage uses it; the
    # answer model stays for the judge on it.
    assert seen == [("embed", []), ("answer", ["encoder"]), ("retrieve", ["encoder", "llm"]),
                    ("judge", ["llm"])]


def test_a_role_the_stage_does_not_declare_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"stage 'sneaky' opened the encoder backend but "
                                           r"declares uses=\('llm',\)"):
        run_toy(tmp_path, [_stage("sneaky", ("llm",), _encoder)])


def test_job_refused_by_the_plan_before_any_stage(tmp_path: Path) -> None:
    stages = [_stage("answer", ("llm",), _llm), _stage("judge", ("judges",), _judges)]
    cfg = compose_cfg(["llm=vllm_qwen2_5_7b", "judge=qwen2_5_32b", "gpu.memory_gb=24",
                       "stages=[answer,judge]", f"paths.cache_dir={tmp_path / 'c'}"])
    SEEN.clear()
    with pytest.raises(GpuPlanError, match=r"^gpu plan: stage judge: judge-qwen2_5_32b .*65\.5 GB"):
        run_stages(cfg, tmp_path / "run", {s.name: s for s in stages})
    assert SEEN == [] and not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize("method", ["structmem", "seem", "flat", "turn_rag", "graph_memory",
                                    "full_context"])
def test_every_packaged_stage_declares_its_roles(method: str) -> None:
    registry = stage_registry(compose_cfg([f"method={method}"]))
    for name, stage in registry.items():
        assert stage.uses is not None, f"{method}: stage {name} declares no uses"
        assert set(stage.uses) <= set(ROLES)
