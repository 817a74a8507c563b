"""flat baseline: StructMem's factual requests, byte for byte; no consolidation; flat reader."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from omegaconf import OmegaConf
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.eval.answer import AnswerInputs, context_builder
from structmem_gpu.methods.baselines import flat
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.structmem import embed, extract, retrieve
from structmem_gpu.methods.structmem.prompts import factual
from tests.unit.test_structmem_stages import FakeBackends, cfg_for, echo, run_stage


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    turns, questions = load_benchmark("sample", sample_path, None, None)
    r = RunDir(tmp_path / "run")
    r.write_table("turns", turns)
    r.write_table("questions", questions)
    return r


class RecordingBackends(FakeBackends):
    """Keeps every request the stage sent (ids, messages, schema, sampling)."""

    def __init__(self) -> None:
        super().__init__({"extract": echo})
        self.sent: list = []
        inner = self.scripted.generate

        def generate(requests, **kw):  # type: ignore[no-untyped-def]
            self.sent.extend(requests)
            return inner(requests, **kw)

        self.scripted.generate = generate  # type: ignore[method-assign]


def test_flat_requests_are_structmems_factual_requests(run: RunDir, tmp_path: Path) -> None:
    sm, fl = RecordingBackends(), RecordingBackends()
    run_stage(run, cfg_for("method=structmem"), sm, extract.STAGE)
    run_stage(run, cfg_for("method=flat"), fl, extract.STAGE)
    factual_sent = [r for r in sm.sent if r.prompt_version == factual.VERSION]
    assert len(fl.sent) == len(factual_sent) > 0 and len(sm.sent) == 2 * len(fl.sent)
    # Same ids, messages, schema and sampling: the response cache key is equal, so a flat run
    # after a StructMem run (or the reverse) sends no extraction request at all.
    assert fl.sent == factual_sent
    assert set(run.read_table("entries")["kind"]) == {"fact"}


def test_flat_config_has_no_consolidation() -> None:
    cfg = cfg_for("method=flat")
    stages = stage_registry(cfg)
    assert "consolidate" not in cfg.method.stages and "consolidate" not in stages
    assert all(s in stages for s in cfg.method.stages)
    assert list(cfg.extract.perspectives) == ["fact"] and cfg.retrieve.syntheses_k == 0
    assert stages["extract"] is extract.STAGE and stages["retrieve"] is retrieve.STAGE
    assert context_builder(cfg.answer.prompt) is flat.build_prompts
    # Every other extraction knob is StructMem's (same windows, same caps).
    sm = cfg_for("method=structmem")
    assert {k: v for k, v in cfg.extract.items() if k != "perspectives"} == {
        k: v for k, v in sm.extract.items() if k != "perspectives"
    }


def test_flat_reader_shows_dated_entries_and_no_syntheses(run: RunDir) -> None:
    cfg, backends = cfg_for("method=flat"), FakeBackends({"extract": echo})
    for stage in (extract.STAGE, embed.STAGE, retrieve.STAGE):
        run_stage(run, cfg, backends, stage)
    ret = run.read_table("retrievals")
    assert set(ret["circuit"]) == {"entries"}
    assert ret.group_by("question_id").len()["len"].max() <= int(cfg.retrieve.entries_k)
    tables = {n: run.read_table(n) for n in ("retrievals", "entries")}
    questions = run.read_table("questions").filter(pl.col("category") < 5)
    build = context_builder(cfg.answer.prompt)
    paper = build(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))  # default protocol
    assert set(paper) == set(questions["question_id"])
    for p in paper.values():
        text = p.messages[-1].content
        assert p.prompt_version == "answer_paper/1" and len(p.messages) == 1
        assert "Memories of " in text and "(recorded on " in text
        assert "Event summaries:" not in text  # flat memory has no syntheses
        assert text.rstrip().splitlines()[-1].startswith("Question: ")
    OmegaConf.update(cfg, "answer.protocol", "reasoned")
    prompts = context_builder(cfg.answer.prompt)(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))
    assert set(prompts) == set(questions["question_id"])
    for p in prompts.values():
        user = p.messages[-1].content
        assert p.prompt_version == "answer_flat/1" and user.startswith("Memories of ")
        assert "Event summaries" not in user and "Event summaries" not in p.messages[0].content
        assert "- [" in user and user.rstrip().splitlines()[-1].startswith("Question: ")
