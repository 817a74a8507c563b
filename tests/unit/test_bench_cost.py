"""Bench cost accounting: per-stage sums from requests.parquet, the LoCoMo extrapolation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.bench.cost import (
    LOCOMO,
    PAPER_TABLE1,
    Target,
    compare_to_paper,
    conversation_table,
    cost_report,
    extrapolate,
    question_stages,
    stage_table,
)


def _req(
    i: int,
    stage: str,
    conv: str | None,
    p: int,
    c: int,
    cached: int | None = None,
    hit: bool = False,
    finish: str = "stop",
) -> dict[str, Any]:
    return {
        "request_id": f"{stage}:{i}",
        "stage": stage,
        "conv_id": conv,
        "model": "m",
        "prompt_version": "v/1",
        "prompt_tokens": p,
        "completion_tokens": c,
        "cached_tokens": cached,
        "latency_s": 0.1,
        "finish_reason": finish,
        "parse_ok": True,
        "cache_hit": hit,
        "attempts": 0 if hit else 1,
        "messages_hash": f"h{i}",
        "reply": "{}",
        "error": None,
    }


REQUESTS = schemas.frame(
    [
        _req(1, "extract", "c1", 100, 10),
        _req(2, "extract", "c1", 120, 20, hit=True),
        _req(3, "extract", "c2", 80, 5, finish="length"),
        _req(4, "consolidate", "c1", 300, 50, cached=64),
        _req(5, "consolidate", "c2", 200, 40),
        _req(6, "answer", "c1", 500, 8),
        _req(7, "answer", "c2", 400, 6),
    ],
    schemas.REQUESTS,
)


def test_stage_table_sums_and_cached_tokens() -> None:
    rows = {r["stage"]: r for r in stage_table(REQUESTS)}
    assert rows["extract"] == {
        "stage": "extract",
        "calls": 3,
        "cache_hits": 1,
        "prompt_tokens": 300,
        "completion_tokens": 35,
        "cached_tokens": None,
        "truncated": 1,
    }
    assert rows["consolidate"]["cached_tokens"] == 64  # reported by the server for one request
    assert rows["answer"]["calls"] == 2


def test_conversation_table_splits_by_conversation() -> None:
    rows = {(r["conv_id"], r["stage"]): r for r in conversation_table(REQUESTS)}
    assert rows[("c1", "extract")]["calls"] == 2
    assert rows[("c2", "consolidate")]["prompt_tokens"] == 200


def test_extrapolation_scales_build_by_turns_and_qa_by_questions() -> None:
    target = Target("t", 10, 1000, 200)
    ex = extrapolate(stage_table(REQUESTS), run_turns=100, run_questions=2, target=target)
    rows = {r["stage"]: r for r in ex["per_stage"]}
    assert rows["extract"]["basis"] == "turns" and rows["extract"]["factor"] == 10
    assert rows["extract"]["calls"] == 30 and rows["extract"]["prompt_tokens"] == 3000
    assert rows["answer"]["basis"] == "questions" and rows["answer"]["factor"] == 100
    assert rows["answer"]["completion_tokens"] == 1400
    # Build total = extract + consolidate only.
    assert ex["build_total"] == {"calls": 50, "prompt_tokens": 8000, "completion_tokens": 1250}


def test_extrapolation_without_turns_gives_none() -> None:
    ex = extrapolate(stage_table(REQUESTS), run_turns=0, run_questions=0)
    assert all(r["calls"] is None for r in ex["per_stage"])


def test_compare_to_paper_ratios() -> None:
    ratios = compare_to_paper(
        {k: 2 * PAPER_TABLE1[k] for k in ("calls", "prompt_tokens", "completion_tokens")}
    )
    assert ratios == {
        "calls_ratio": 2.0,
        "prompt_tokens_ratio": 2.0,
        "completion_tokens_ratio": 2.0,
    }
    assert LOCOMO.turns == 5882 and LOCOMO.conversations == 10 and LOCOMO.questions == 1540


def test_cost_report_reads_a_run_directory(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.write_table("requests", REQUESTS)
    turns = pl.DataFrame({"conv_id": ["c1"] * 60 + ["c2"] * 40})
    turns.write_parquet(run.table_path("turns"))
    pl.DataFrame({"question_id": ["q1", "q2"]}).write_parquet(run.table_path("answers"))
    rep = cost_report(tmp_path)
    assert (rep["turns"], rep["conversations"], rep["questions_answered"]) == (100, 2, 2)
    ext = {r["stage"]: r for r in rep["extrapolation"]["per_stage"]}
    assert ext["extract"]["factor"] == pytest.approx(58.82)
    assert ext["answer"]["factor"] == 770
    assert rep["paper_table1"]["calls"] == 1056
    assert len(rep["per_conversation"]) == 6


def test_cost_report_needs_requests(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cost_report(tmp_path)


def test_per_question_stages_come_from_the_run_method_declarations(tmp_path: Path) -> None:
    """SEEM's retrieve sends one query (and filter) request per question: it scales by
    questions, as its declaration says (it reads the questions table), not by turns."""
    # No saved config: the packaged methods' declarations (every method's retrieve reads the
    # questions table, so a run without a config scales it by questions too; so does a baseline
    # system's search).
    assert question_stages(tmp_path) == frozenset({"answer", "judge", "retrieve", "system_search"})
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "method:\n  implementations:\n"
        "    frames: structmem_gpu.methods.seem.frames:STAGE\n"
        "    retrieve: structmem_gpu.methods.seem.retrieve:STAGE\n"
        "    answer: structmem_gpu.eval.answer:STAGE\n"
        "    consolidate: null\n"
        "    gone: structmem_gpu.methods.nowhere:STAGE\n"
    )
    assert question_stages(tmp_path) == frozenset({"answer", "judge", "retrieve", "system_search"})
    rows = [{"stage": s, "calls": 10, "prompt_tokens": 100, "completion_tokens": 10}
            for s in ("frames", "retrieve")]
    ex = extrapolate(rows, run_turns=100, run_questions=10, target=Target("t", 1, 1000, 100),
                     per_question=question_stages(tmp_path))
    basis = {r["stage"]: (r["basis"], r["calls"]) for r in ex["per_stage"]}
    assert basis == {"frames": ("turns", 100), "retrieve": ("questions", 100)}
