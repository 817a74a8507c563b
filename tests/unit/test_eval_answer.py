"""Answer stage: context-builder registry, prompt rendering, full-context truncation, rows."""

from __future__ import annotations

from datetime import datetime

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.core.errors import ConfigError, MissingTableError
from structmem_gpu.eval.answer import (
    AnswerInputs,
    AnswerPrompt,
    answer_rows,
    clean_prediction,
    context_builder,
    make_requests,
    register_context_builder,
)
from structmem_gpu.llm.types import LLMResult, Message, Sampling
from structmem_gpu.methods.baselines.full_context import build_prompts, render_history
from tests.fixtures.pipeline import job_with
from structmem_gpu.eval.prompts import answer_structmem as P

D1, D2 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 9, 5)


def test_builders_are_import_paths_or_registered_names() -> None:
    assert (
        context_builder("structmem_gpu.methods.baselines.full_context:build_prompts")
        is build_prompts
    )

    def mine(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
        return {}

    register_context_builder("mine_for_test", mine)
    assert context_builder("mine_for_test") is mine
    with pytest.raises(ConfigError, match="unknown answer.prompt 'nope'"):
        context_builder("nope")
    with pytest.raises(ConfigError, match="cannot import"):
        context_builder("structmem_gpu.nope:fn")


def test_structmem_prompt_groups_by_speaker_with_dates_and_ranges() -> None:
    entries = [
        P.MemoryLine("Ana", D1, "Ana adopted a cat."),
        P.MemoryLine("Ben", D2, "Ben ran a race."),
        P.MemoryLine("Ana", D2, "Ana moved to Porto."),
    ]
    synths = [P.SynthesisLine(D1, D2, "Ana and Ben both changed routines.")]
    system, user = P.build_messages(
        "Where does Ana live?", entries, synths, now=datetime(2023, 6, 5)
    )
    assert "Not mentioned in the conversation" in system.content and "most recent" in system.content
    assert user.content.splitlines() == [
        "Memories of Ana:",
        "- [8 May 2023] Ana adopted a cat.",
        "- [1 June 2023] Ana moved to Porto.",
        "Memories of Ben:",
        "- [1 June 2023] Ben ran a race.",
        "Event summaries:",
        "- [8 May 2023 to 1 June 2023] Ana and Ben both changed routines.",
        "Current date: Monday, 5 June 2023",
        "Question: Where does Ana live?",
    ]
    _, empty = P.build_messages("Q?", [], [])
    assert "(no memories retrieved)" in empty.content and "Current date" not in empty.content


def _turns() -> pl.DataFrame:
    rows = []
    for s, when in [(1, D1), (2, D2)]:
        for t in range(3):
            rows.append(
                {
                    "conv_id": "c",
                    "session_index": s,
                    "session_id": f"S{s}",
                    "session_hash": "h",
                    "session_time": when,
                    "turn_index": t,
                    "dia_id": f"D{s}:{t + 1}",
                    "event_id": f"c:D{s}:{t + 1}",
                    "speaker": "Ana" if t % 2 == 0 else "Ben",
                    "text": f"s{s} turn {t} " + "x" * 40,
                    "image_caption": "a dog" if t == 2 else None,
                    "has_answer": None,
                }
            )
    return schemas.frame(rows, schemas.TURNS)


def test_full_context_newest_first_and_truncated_oldest_first() -> None:
    whole = render_history(_turns(), context_tokens=10_000)
    assert not whole.truncated and whole.sessions_shown == 2
    lines = whole.text.splitlines()
    assert (
        lines[0] == "Session 2 (9:05 am on 1 June 2023):"
        and lines[4] == "Session 1 (1:56 pm on 8 May 2023):"
    )
    assert lines[3].endswith("[image: a dog]")
    # Room for session 2 and only the latest turn of session 1.
    budget_chars = len("\n".join(lines[:4])) + 1 + len(lines[4]) + 2 + len(lines[7]) + 1
    cut = render_history(_turns(), context_tokens=budget_chars // 4 + 1)
    assert cut.truncated and cut.sessions_shown == 2
    assert cut.text.splitlines()[4:] == [
        lines[4],
        lines[7],
        "(older sessions omitted to fit the context)",
    ]
    assert len(cut.text) <= (budget_chars // 4 + 1) * 4 + 60  # the note is the only overflow


def _questions(n: int = 2) -> pl.DataFrame:
    return schemas.frame(
        [
            {
                "conv_id": "c",
                "question_id": f"c:q{i}",
                "question": f"Q{i}?",
                "answer": "a",
                "adversarial_answer": None,
                "category": 4,
                "category_name": "single-hop",
                "evidence": [],
                "evidence_raw": [],
                "question_time": None,
                "is_abstention": False,
            }
            for i in range(n)
        ],
        schemas.QUESTIONS,
    )


def test_full_context_builder_needs_turns_and_shares_history() -> None:
    cfg = job_with({"answer": {"context_tokens": 10_000}}, ["llm=scripted"])
    prompts = build_prompts(AnswerInputs(cfg, _questions(), {"turns": _turns()}))
    a, b = prompts["c:q0"].messages[1].content, prompts["c:q1"].messages[1].content
    assert a.split("Question:")[0] == b.split("Question:")[0] and a.endswith("Question: Q0?")
    with pytest.raises(MissingTableError, match="needs table 'turns'"):
        build_prompts(AnswerInputs(cfg, _questions(), {}))


def _result(rid: str, text: str, ok: bool = True, error: str | None = None) -> LLMResult:
    return LLMResult(
        rid, text, None, ok, 1, 1, None, 0.0, "stop" if ok else "error", False, 1, "h", "m", error
    )


def test_rows_for_every_question_and_failures_recorded() -> None:
    q = _questions(3)
    prompts = {qid: AnswerPrompt((Message("user", "x"),), "v/1") for qid in q["question_id"]}
    reqs = make_requests(q, prompts, Sampling(max_tokens=8))
    assert len({r.request_id for r in reqs}) == 3 and all(r.schema is None for r in reqs)
    rows = answer_rows(
        q,
        [
            _result(reqs[0].request_id, "Answer: Rome"),
            _result(reqs[1].request_id, "   "),
            _result(reqs[2].request_id, "", ok=False, error="server down"),
        ],
    )
    assert rows["prediction"].to_list() == ["Rome", "", ""]
    assert rows["parse_ok"].to_list() == [True, False, False]
    with pytest.raises(RuntimeError, match="no prompt for 1 questions"):
        make_requests(q, {k: v for k, v in list(prompts.items())[:2]}, Sampling())


def test_clean_prediction() -> None:
    assert clean_prediction("  final answer:  7 May 2023 \n") == "7 May 2023"
    assert (
        clean_prediction("Not mentioned in the conversation") == "Not mentioned in the conversation"
    )
