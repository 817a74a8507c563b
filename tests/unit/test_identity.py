"""One identity (structmem_gpu/config/identity.py): a knob's role decides every key it enters.

- A reply knob (role "reply": llm.request_seed, llm.repair_attempts) reruns the LLM stages of a
  run directory; a run knob (llm.progress) reruns nothing and names no other run directory.
- A knob added to a fixture model enters the stage fingerprint, the run key, the
  response-cache key and the judge identity with no other file touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from omegaconf import OmegaConf
from pydantic import Field

from structmem_gpu.config import run_key as rk
from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import JudgeSettings, PanelMember
from structmem_gpu.config.result_keys import changes_result
from structmem_gpu.config.schema import JobSettings, LLMSettings
from structmem_gpu.config.settings import REPLY_ROLE, RUN_ROLE, Settings
from structmem_gpu.eval.judge import judge_identity
from structmem_gpu.llm.factory import _http_backend
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import stage_config
from tests.fixtures.pipeline import compose_cfg, run_pipeline

BASE = ["debug=scripted", "stages=[load,extract]"]


def _ran(overrides: list[str], run_dir: Path) -> dict[str, bool]:
    """stage -> whether it ran (False: skipped as finished)."""
    return {o.name: not o.skipped for o in run_pipeline([*BASE, *overrides], run_dir)}


def test_reply_knobs_rerun_the_llm_stages_and_run_knobs_do_not(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # a fixed hydra.run.dir: every command below shares it
    assert _ran([], run_dir) == {"load": True, "extract": True}
    assert _ran([], run_dir) == {"load": False, "extract": False}
    # How the server runs and reports: nothing reruns.
    for knob in ("llm.progress=false", "llm.n_threads=1", "llm.max_retries=1"):
        assert _ran([knob], run_dir) == {"load": False, "extract": False}, knob
    # What changes a reply: the LLM stage reruns (load, which sends nothing, does not).
    assert _ran(["llm.request_seed=false"], run_dir) == {"load": False, "extract": True}
    assert _ran(["llm.repair_attempts=2"], run_dir) == {"load": False, "extract": True}


def test_run_knobs_name_no_run_directory_and_reply_knobs_do() -> None:
    assert rk.run_key(["llm.progress=false", "llm.n_threads=4", "llm.api_key_env=K"]) == ""
    assert rk.run_key(["llm.request_seed=false"]) == "llm.request_seed=false"
    assert rk.run_key(["judge=gpt_4o_endpoint", "judge.llm.progress=false"], "sweep") == (
        "judge=gpt_4o_endpoint")


# ---- a knob added to a fixture model ---------------------------------------------------------

class LLMWithKnobs(LLMSettings):
    """LLMSettings after a developer added two knobs: one field each, nothing else."""

    top_k: Annotated[int, Field(ge=0), REPLY_ROLE] = Field(
        0, description="Sampling: the k most likely tokens only; 0 = off.")
    log_every_s: Annotated[float, Field(gt=0), RUN_ROLE] = Field(
        30.0, description="Seconds between progress log lines: how it runs, never hashed.")


@contextlib.contextmanager
def llm_model(model: type[LLMSettings]) -> Iterator[None]:
    """Every llm field of the configuration (the job's, the judge's, a panel member's, the
    judge's *_llm keys) typed by `model` for the block: what the one file holding LLMSettings
    would declare."""
    owners: list[type[Settings]] = [JobSettings, JudgeSettings, PanelMember]
    saved = [(o, o.model_fields["llm"].annotation) for o in owners]
    keys = dict(JudgeSettings.open_keys)
    try:
        for o, ann in saved:
            o.model_fields["llm"].annotation = model if o is JobSettings else model | None
            o.model_rebuild(force=True)
        JudgeSettings.open_keys = {"*_llm": model}
        yield
    finally:
        for o, ann in saved:
            o.model_fields["llm"].annotation = ann
            o.model_rebuild(force=True)
        JudgeSettings.open_keys = keys


@pytest.mark.e2e  # e2e: composes every model role's configs
def test_a_knob_added_to_a_model_enters_every_key_its_role_calls_for() -> None:
    def job(*overrides: str) -> JobConfig:
        cfg = compose_cfg(["judge=gpt_4o_mini_endpoint"])  # the judge has an llm of its own
        OmegaConf.set_struct(cfg, False)  # the YAML bases predate the fixture's knobs
        for o in overrides:
            key, value = o.split("=")
            OmegaConf.update(cfg, key, float(value) if "." in value else int(value))
        return JobConfig.from_cfg(cfg)

    with llm_model(LLMWithKnobs):
        base, top_k, log = job(), job("llm.top_k=5", "judge.llm.top_k=5"), job("llm.log_every_s=5.0")
        assert isinstance(top_k.root.llm, LLMWithKnobs) and top_k.root.llm.top_k == 5
        extract = stage_registry(base)["extract"]
        # the stage fingerprint
        assert stage_config(extract, top_k) != stage_config(extract, base)
        assert stage_config(extract, log) == stage_config(extract, base)
        # the run-directory key
        assert changes_result("llm.top_k") and changes_result("judge.llm.top_k")
        assert not changes_result("llm.log_every_s") and not changes_result("judge.panel.1.llm.log_every_s")
        # the response-cache key: the reply knob away from its default, nothing at it
        assert _http_backend(top_k.root.llm, "http://h/v1").cache_params == {"top_k": 5}
        assert _http_backend(base.root.llm, "http://h/v1").cache_params == {}
        assert _http_backend(log.root.llm, "http://h/v1").cache_params == {}
        # the judge identity
        assert judge_identity(top_k)["llm"]["top_k"] == 5 != judge_identity(base)["llm"]["top_k"]
        assert "log_every_s" not in judge_identity(base)["llm"]
    assert "top_k" not in LLMSettings.model_fields and JobSettings.model_fields["llm"].annotation is LLMSettings
