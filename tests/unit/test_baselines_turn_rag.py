"""turn_rag baseline: no LLM before answering; raw turns retrieved by event id; dated reader."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.eval.answer import AnswerInputs, context_builder
from structmem_gpu.eval.recall import recall_by_question
from structmem_gpu.methods.baselines import turn_rag
from structmem_gpu.methods.registry import stage_registry
from tests.unit.test_structmem_stages import FakeBackends, cfg_for, run_stage


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    turns, questions = load_benchmark("sample", sample_path, None, None)
    r = RunDir(tmp_path / "run")
    r.write_table("turns", turns)
    r.write_table("questions", questions)
    return r


def build(run: RunDir, *overrides: str) -> tuple[FakeBackends, list]:
    cfg, backends = cfg_for("method=turn_rag", *overrides), FakeBackends()
    ctxs = [
        run_stage(run, cfg, backends, s) for s in (turn_rag.EMBED_STAGE, turn_rag.RETRIEVE_STAGE)
    ]
    return backends, ctxs


def test_no_llm_call_before_answer(run: RunDir) -> None:
    backends, ctxs = build(run)
    assert backends.scripted.calls == 0
    assert all(c.batches == 0 and not c.request_frames for c in ctxs)
    stages = stage_registry(cfg_for("method=turn_rag"))
    cfg = cfg_for("method=turn_rag")
    assert list(cfg.method.stages) == ["load", "embed", "retrieve", "answer", "judge", "report"]
    assert all(s in stages for s in cfg.method.stages)


def test_turns_embedded_with_speaker_and_date(run: RunDir) -> None:
    backends, _ = build(run)
    turns, emb = run.read_table("turns"), run.read_table("turn_embeddings")
    assert sorted(emb["item_id"]) == sorted(turns["event_id"]) and emb.height == turns.height
    embedded = backends.model.embedded
    first = turns.sort("conv_id", "session_index", "turn_index").row(0, named=True)
    assert embedded[0].startswith(f"{first['session_time']:%Y-%m-%d} {first['speaker']}: ")
    captioned = turns.filter(pl.col("image_caption").is_not_null())
    assert captioned.height and any(
        f"[image: {captioned['image_caption'][0]}]" in t for t in embedded
    )


def test_retrieves_top_k_turns_of_the_questions_conversation(run: RunDir) -> None:
    build(run, "retrieve.turns_k=5")
    ret, turns = run.read_table("retrievals"), run.read_table("turns")
    q = run.read_table("questions").filter(pl.col("category") < 5)
    assert set(ret["circuit"]) == {"turns"} and set(ret["question_id"]) == set(q["question_id"])
    assert ret.group_by("question_id").len()["len"].to_list() == [5] * q.height
    conv_of = dict(zip(turns["event_id"], turns["conv_id"], strict=True))
    assert all(conv_of[i] == c for i, c in zip(ret["item_id"], ret["conv_id"], strict=True))
    # item_id = event_id: evidence recall resolves every retrieved turn.
    recall, unresolved = recall_by_question(q, ret, None, None)
    assert unresolved == 0 and any(v is not None and v > 0 for v in recall.values())


def test_reader_lists_turns_in_conversation_order(run: RunDir) -> None:
    build(run, "retrieve.turns_k=4")
    cfg = cfg_for("method=turn_rag")
    tables = {n: run.read_table(n) for n in ("retrievals", "turns")}
    questions = run.read_table("questions").filter(pl.col("category") < 5)
    prompts = context_builder(cfg.answer.prompt)(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))
    for p in prompts.values():
        lines = p.messages[-1].content.splitlines()
        assert (
            lines[0] == "Conversation excerpts (oldest first):"
            and p.prompt_version == "answer_turn_rag/1"
        )
        body = [ln for ln in lines if ln.startswith("- [")]
        assert len(body) == 4
    turns = tables["turns"]
    rows = tables["retrievals"].filter(pl.col("question_id") == questions["question_id"][0])
    order = turns.filter(pl.col("event_id").is_in(rows["item_id"].to_list())).sort(
        "session_index", "turn_index"
    )
    user = prompts[questions["question_id"][0]].messages[-1].content
    positions = [user.index(f"{s}: {t}") for s, t in order.select("speaker", "text").iter_rows()]
    assert positions == sorted(positions)
