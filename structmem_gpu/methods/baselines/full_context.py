"""full_context baseline: no memory, the raw history in the prompt (`answer.prompt: full_context`).

    python jobs/run.py method=full_context benchmark=sample

Sessions are rendered newest first with a date header; turns keep their order inside a session.
The history is cut to `answer.context_tokens`, estimated as characters / 4 (the usual ratio
for English with Llama/Qwen/SmolLM tokenizers; no tokenizer is loaded, so the estimate is
model-independent and free). The oldest sessions are dropped first; the first session that
does not fit keeps its latest turns that do. Each conversation is rendered once and shared by
its questions (LoCoMo: ~200 questions per conversation); a history whose prompt (with the
conversation's longest question) is over the answer model's context gets a smaller budget
(eval/context_fit.py). `answer.context_tokens: null` is the whole-history mode of the papers'
full-context baselines (a long-context model reads every session, nothing cut or trimmed): a
conversation whose prompt the answer model's context cannot hold is named in one warning line
and its questions are refused by the context guard (finish_reason over_context, counted in the
manifest and report), never silently cut. One rendered block:

    Session 5 (7:05 pm on 17 March 2024):
    Tomas: Here he is on his first walk! [image: a photo of a small beagle puppy]
    Ana: He is adorable!

`answer.history_order: flat` (StructMem Table 1 "OpenAI" as Appendix A.4 describes it: all
turns concatenated as flat text, no retrieval) renders every turn in the conversation's order,
one `Speaker: text` line each, with no session header or date; a budget drops the earliest
turns first. The default, `newest_first`, is the block above (A.4's FullContext: the whole
history in reverse chronological order, session by session).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from structmem_gpu.data.common import display_text
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt, AnswerSettings
from structmem_gpu.eval.context_fit import fit_prompt, reader_fits, trim_note
from structmem_gpu.methods.baselines.prompts import answer_full_context as P

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4  # token estimate for the context budget (see module docstring)


@dataclass(frozen=True)
class History:
    text: str
    sessions_shown: int
    sessions_total: int
    truncated: bool


def _session_blocks(turns: pl.DataFrame) -> list[tuple[str, list[str]]]:
    """(header, turn lines) per session, newest session first."""
    ordered = turns.sort(["session_index", "turn_index"], descending=[True, False])
    blocks: list[tuple[str, list[str]]] = []
    current: int | None = None
    for idx, time, speaker, text, caption in ordered.select(
        "session_index", "session_time", "speaker", "text", "image_caption"
    ).iter_rows():
        if idx != current:
            blocks.append((P.session_header(idx, time), []))
            current = idx
        blocks[-1][1].append(f"{speaker}: {display_text(text or '', caption)}")
    return blocks


def _render_flat(turns: pl.DataFrame, context_tokens: int | None) -> History:
    """Every turn in the conversation's order, no session headers or dates; cut to the budget
    from the earliest turn on (None = the whole history)."""
    ordered = turns.sort(["session_index", "turn_index"])
    sessions = ordered["session_index"].to_list()
    lines = [f"{speaker}: {display_text(text or '', caption)}" for speaker, text, caption in
             ordered.select("speaker", "text", "image_caption").iter_rows()]
    total = len(set(sessions))
    if context_tokens is None:
        return History("\n".join(lines), total, total, False)
    budget = max(0, int(context_tokens)) * CHARS_PER_TOKEN
    kept = _latest_turns_that_fit(lines, budget - len(P.FLAT_TRUNCATED_NOTE) - 1)
    if len(kept) == len(lines):
        return History("\n".join(lines), total, total, False)
    shown = len(set(sessions[len(lines) - len(kept):]))
    return History("\n".join([P.FLAT_TRUNCATED_NOTE, *kept]), shown, total, True)


def render_history(turns: pl.DataFrame, context_tokens: int | None,
                   order: str = "newest_first") -> History:
    """Newest sessions first (`order` flat: every turn in order, no headers), cut to
    `context_tokens * CHARS_PER_TOKEN` characters (None = the whole history)."""
    if order == "flat":
        return _render_flat(turns, context_tokens)
    if context_tokens is None:
        blocks = _session_blocks(turns)
        text = "\n".join("\n".join([h, *lines]) for h, lines in blocks)
        return History(text, len(blocks), len(blocks), False)
    budget = max(0, int(context_tokens)) * CHARS_PER_TOKEN
    blocks = _session_blocks(turns)
    parts: list[str] = []
    used, shown, truncated = 0, 0, False
    for header, lines in blocks:
        block = "\n".join([header, *lines])
        if used + len(block) + 1 <= budget:
            parts.append(block)
            used += len(block) + 1
            shown += 1
            continue
        truncated = True
        tail = _latest_turns_that_fit(lines, budget - used - len(header) - 2)
        if tail:  # a partial session: its latest turns (closest to the question)
            parts.append("\n".join([header, *tail]))
            shown += 1
        break
    if truncated:
        parts.append(P.TRUNCATED_NOTE)
    return History("\n".join(parts), shown, len(blocks), truncated)


def _latest_turns_that_fit(lines: Sequence[str], budget: int) -> list[str]:
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        if used + len(line) + 1 > budget:
            break
        kept.append(line)
        used += len(line) + 1
    return kept[::-1]


def _whole_histories(
    inputs: AnswerInputs,
    turns: pl.DataFrame,
    convs: Sequence[str],
    longest: dict[str, tuple[str, Any]],
    fits: Any,
    order: str,
) -> dict[str, History]:
    """Every conversation's whole history; one warning line names those the answer model's
    context cannot hold (the guard refuses their requests: over_context)."""
    out: dict[str, History] = {}
    over: list[str] = []
    for (conv,), conv_turns in turns.filter(pl.col("conv_id").is_in(convs)).group_by(
        ["conv_id"], maintain_order=True
    ):
        out[conv] = render_history(conv_turns, None, order)
        q, now = longest.get(conv, ("", None))
        if not fits(P.build_messages(q, out[conv].text, now, order == "flat")):
            over.append(str(conv))
    if over:
        from structmem_gpu.llm.factory import config_guard

        limit = config_guard(inputs.job.root.llm).limit
        n_q = int(inputs.questions["conv_id"].is_in(over).sum())
        log.warning(
            "full_context (whole history, answer.context_tokens=null): %d of %d conversations "
            "(%s) do not fit the answer model's context (%s tokens, %s); the context guard "
            "refuses their %d questions (over_context)",
            len(over), len(out), ", ".join(over[:5]) + (" ..." if len(over) > 5 else ""),
            limit.tokens, limit.source, n_q,
        )
    return out


def _budget_histories(
    turns: pl.DataFrame,
    convs: Sequence[str],
    longest: dict[str, tuple[str, Any]],
    fits: Any,
    context_tokens: int,
    order: str,
) -> tuple[dict[str, History], int]:
    """Every conversation's history cut to the budget, trimmed further to fit the context."""
    histories: dict[str, History] = {}
    trimmed = 0
    for (conv,), conv_turns in turns.filter(pl.col("conv_id").is_in(convs)).group_by(["conv_id"]):
        # Over the model's context: a smaller history budget, oldest sessions still first out.
        def build(share: float, conv_turns: pl.DataFrame = conv_turns) -> History:
            return render_history(conv_turns, int(context_tokens * share), order)

        q, now = longest.get(conv, ("", None))
        histories[conv], over = fit_prompt(
            build, lambda h, q=q, now=now: fits(P.build_messages(q, h.text, now, order == "flat"))
        )
        trimmed += over
    return histories, trimmed


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    turns = inputs.require("turns", "full_context")
    settings = inputs.job.settings(AnswerSettings)
    context_tokens = settings.context_tokens  # None: the whole history
    order = settings.history_order
    flat = order == "flat"
    convs = inputs.questions["conv_id"].unique().to_list()
    fits = reader_fits(inputs.job)
    longest: dict[str, tuple[str, Any]] = {}  # conv -> its longest question (with its time)
    asked = inputs.questions.select("conv_id", "question", "question_time")
    for conv, question, now in asked.iter_rows():
        if len(question) >= len(longest.get(conv, ("", None))[0]):
            longest[conv] = (question, now)
    trimmed = 0
    if context_tokens is None:  # the whole history: nothing cut, the guard refuses what won't fit
        histories = _whole_histories(inputs, turns, convs, longest, fits, order)
    else:
        histories, trimmed = _budget_histories(turns, convs, longest, fits, context_tokens, order)
    if note := trim_note("full_context", trimmed, len(histories)):
        log.warning("%s (oldest sessions first)", note)
    cut = sum(h.truncated for h in histories.values())
    if cut:  # never in whole-history mode
        log.info(
            "full_context: %d of %d conversations truncated to ~%d tokens",
            cut,
            len(histories),
            context_tokens,
        )
    out = {}
    for qid, conv, question, now in inputs.questions.select(
        "question_id", "conv_id", "question", "question_time"
    ).iter_rows():
        hist = histories.get(conv)
        text = hist.text if hist else "(no history)"
        out[qid] = AnswerPrompt(P.build_messages(question, text, now, flat),
                                P.FLAT_VERSION if flat else P.VERSION)
    return out
