"""full_context's whole-history mode (`answer.context_tokens: null`): nothing cut, and a
history the answer model's context cannot hold is named in one warning line (the context
guard then refuses those requests: over_context)."""

from __future__ import annotations

import logging

import polars as pl
import pytest
from omegaconf import OmegaConf

from structmem_gpu.eval.answer import AnswerInputs
from structmem_gpu.methods.baselines.full_context import build_prompts, render_history
from tests.unit.test_eval_answer import _questions, _turns


def _cfg(n_ctx: int) -> object:
    return OmegaConf.create({
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
    # A history over the smallest context the schema allows (llm.n_ctx >= 256).
    turns = _turns().with_columns(pl.col("text") + " " + "y" * 200)
    with caplog.at_level(logging.WARNING):
        prompts = build_prompts(AnswerInputs(_cfg(256), _questions(), {"turns": turns}))
    lines = [r.getMessage() for r in caplog.records if "whole history" in r.getMessage()]
    assert len(lines) == 1 and "1 of 1 conversations (c)" in lines[0]
    assert "256 tokens" in lines[0] and "refuses their 2 questions" in lines[0]
    assert render_history(turns, None).text in prompts["c:q1"].messages[1].content  # uncut
