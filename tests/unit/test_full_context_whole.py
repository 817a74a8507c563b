"""full_context's whole-history mode (`answer.context_tokens: null`): nothing cut, and a
history the answer model's context cannot hold is named in one warning line (the context
guard then refuses those requests: over_context)."""

from __future__ import annotations

import logging

import polars as pl
import pytest

from structmem_gpu.eval.answer import AnswerInputs
from structmem_gpu.methods.baselines.full_context import build_prompts, render_history
from structmem_gpu.config.job import JobConfig
from tests.fixtures.pipeline import job_with
from tests.unit.test_eval_answer import _questions, _turns


def _cfg(n_ctx: int) -> JobConfig:
    return job_with({
        "answer": {"context_tokens": None, "max_tokens": 16},
        "llm": {"backend": "llamacpp", "model": "x", "tokenizer": "chars", "n_ctx": n_ctx},
    })


def test_whole_history_keeps_every_turn_and_never_trims(caplog: pytest.LogCaptureFixture) -> None:
    turns = _turns()
    whole = render_history(turns, None)
    assert not whole.truncated and whole.sessions_shown == whole.sessions_total == 2
    assert len(whole.text.splitlines()) == turns.height + 2  # every turn, one header per session
    with caplog.at_level(logging.WARNING):
        prompts = build_prompts(AnswerInputs(_cfg(8192), _questions(), {"turns": turns}))
    assert whole.text in prompts["c:q0"].messages[1].content and not caplog.records


def test_whole_history_over_the_context_is_one_warning_never_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # longer turns: a history well over llm.n_ctx's smallest allowed value (256)
    turns = _turns().with_columns(pl.col("text") + " " + "y" * 400)
    with caplog.at_level(logging.WARNING):
        prompts = build_prompts(AnswerInputs(_cfg(256), _questions(), {"turns": turns}))
    lines = [r.getMessage() for r in caplog.records if "whole history" in r.getMessage()]
    assert len(lines) == 1 and "1 of 1 conversations (c)" in lines[0]
    assert "256 tokens" in lines[0] and "refuses their 2 questions" in lines[0]
    assert render_history(turns, None).text in prompts["c:q1"].messages[1].content  # uncut


def test_flat_history_is_every_turn_in_order_without_headers() -> None:
    """answer.history_order=flat: StructMem Table 1's OpenAI row as Appendix A.4 describes it
    (all turns concatenated as flat text); the default stays sessions newest first."""
    from structmem_gpu.methods.baselines.prompts import answer_full_context as P

    turns = _turns()
    flat = render_history(turns, None, "flat")
    lines = flat.text.splitlines()
    assert len(lines) == turns.height and not flat.truncated  # no session header, every turn
    assert lines[0].startswith("Ana: s1 turn 0") and lines[-1] == "Ana: s2 turn 2 " + "x" * 40 + " [image: a dog]"
    assert "Session" not in flat.text
    # a budget drops the earliest turns first, saying so
    cut = render_history(turns, 40, "flat")
    assert cut.truncated and cut.text.splitlines()[0] == P.FLAT_TRUNCATED_NOTE
    assert cut.text.splitlines()[-1] == lines[-1] and cut.sessions_shown == 1
    # the prompt: flat header and rules, its own prompt version; the default unchanged
    cfg = job_with({"answer": {"context_tokens": None, "max_tokens": 16, "history_order": "flat"},
                    "llm": {"backend": "llamacpp", "model": "x", "tokenizer": "chars", "n_ctx": 8192}})
    prompt = build_prompts(AnswerInputs(cfg, _questions(), {"turns": turns}))["c:q0"]
    assert prompt.prompt_version == P.FLAT_VERSION
    system, user = (m.content for m in prompt.messages)
    assert system == P.FLAT_SYSTEM and user.startswith(P.FLAT_HEADER + "\n" + flat.text)
    default = build_prompts(AnswerInputs(_cfg(8192), _questions(), {"turns": turns}))["c:q0"]
    assert default.prompt_version == P.VERSION and default.messages[0].content == P.SYSTEM
    assert render_history(turns, None).text.startswith("Session 2")
