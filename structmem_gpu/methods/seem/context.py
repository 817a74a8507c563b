"""SEEM's QA context builder for the shared answer stage (`answer.prompt: seem`).

    python jobs/run.py method=seem stages=[answer] hydra.run.dir=DIR

Reads only retrievals.parquet (SEEM's columns: in_context, context_order, text, time,
event_ids) and turns.parquet (session numbers), so the shared answer stage's fingerprint
(its `answer` config plus those tables) covers every ablation switch. Per question: facts in
rank order, frames and passages chronological (`context_order`), cut to
`answer.context_tokens` (characters / 4) by dropping the lowest-ranked passages first (RPE
passages before P_ret), then facts; frames are never dropped. A prompt still over the answer
model's context gets a smaller budget, dropped in the same order (eval/context_fit.py). One frame header:
`[Memory 2] sessions 3-5, 2024-03-17 to 2024-04-02`.

The shared answer stage finds this builder by name (structmem_gpu/eval/answer.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from structmem_gpu.core.errors import ConfigError, MissingTableError
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt, AnswerSettings
from structmem_gpu.eval.context_fit import fit_prompt, reader_fits, trim_note
from structmem_gpu.methods.seem.prompts import answer as P

log = logging.getLogger(__name__)

PROMPT_NAME = "seem"
CHARS_PER_TOKEN = 4  # same estimate as the full_context baseline
_NEEDED = ("in_context", "context_order", "text", "time", "event_ids")


@dataclass(frozen=True)
class Item:
    circuit: str
    rank: int
    order: int
    text: str


def _session_of(turns: pl.DataFrame | None) -> dict[str, tuple[int, object]]:
    if turns is None:
        return {}
    return {e: (s, t) for e, s, t in turns.select("event_id", "session_index", "session_time").iter_rows()}


def frame_header(n: int, event_ids: list[str], sessions: Mapping[str, tuple[int, object]]) -> str:
    found = [sessions[e] for e in event_ids if e in sessions]
    if not found:
        return f"[Memory {n}]"
    idx = sorted({s for s, _ in found})
    days = sorted({t.strftime("%Y-%m-%d") for _, t in found if t is not None})  # type: ignore[attr-defined]
    where = f"session {idx[0]}" if len(idx) == 1 else f"sessions {idx[0]}-{idx[-1]}"
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}" if days else "?"
    return f"[Memory {n}] {where}, {when}"


def _items(rows: pl.DataFrame, sessions: Mapping[str, tuple[int, object]]) -> list[Item]:
    out = []
    frames = rows.filter(pl.col("circuit") == "frames").sort("context_order")
    for n, r in enumerate(frames.iter_rows(named=True), start=1):
        out.append(Item("frames", r["rank"], r["context_order"],
                        f"{frame_header(n, r['event_ids'] or [], sessions)}\n{r['text']}"))
    for r in rows.filter(pl.col("circuit") == "turns").iter_rows(named=True):
        s = sessions.get(r["item_id"])
        where = f"session {s[0]}, " if s else ""
        out.append(Item("turns", r["rank"], r["context_order"], f"[{where}{P.format_time(r['time'])}] {r['text']}"))
    out.extend(Item("facts", r["rank"], r["context_order"], r["text"])
               for r in rows.filter(pl.col("circuit") == "facts").iter_rows(named=True))
    return out


def fit(items: list[Item], budget_chars: int) -> list[Item]:
    """Drop the lowest-ranked passages first (RPE passages rank after P_ret, so they go first),
    then the lowest-ranked facts, until the texts fit. Frames are never dropped: they are the
    component with the largest ablation effect (SEEM Table 3); a context of frames alone that
    exceeds the budget is kept whole."""
    frames = [i for i in items if i.circuit == "frames"]
    droppable = sorted((i for i in items if i.circuit != "frames"),
                       key=lambda i: (("facts", "turns").index(i.circuit), i.rank))
    total = sum(len(i.text) + 1 for i in items)
    while droppable and total > budget_chars:
        total -= len(droppable.pop().text) + 1
    return [*droppable, *frames]


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    ret = inputs.require("retrievals", PROMPT_NAME)
    missing = [c for c in _NEEDED if c not in ret.columns]
    if missing:
        raise MissingTableError(f"answer.prompt=seem needs retrievals written by SEEM's retrieve stage "
                                f"(columns {missing} are missing); run stages=[retrieve] with method=seem")
    sessions = _session_of(inputs.table("turns"))
    context_tokens = inputs.job.settings(AnswerSettings).context_tokens
    if context_tokens is None:
        raise ConfigError("answer.context_tokens=null: SEEM's reader needs a budget (an integer >= 1)")
    budget = context_tokens * CHARS_PER_TOKEN
    ret = ret.filter(pl.col("in_context"))
    by_q = {str(q): g for (q,), g in ret.group_by("question_id")}
    fits = reader_fits(inputs.job)
    out, cut, trimmed = {}, 0, 0
    for qid, question, now in inputs.questions.select("question_id", "question", "question_time").iter_rows():
        items = _items(by_q.get(qid, ret.clear()), sessions)

        def build(share: float) -> tuple[Any, int]:
            # Over the model's context: a smaller budget, dropped in fit's order (RPE passages,
            # then P_ret passages, then facts).
            kept = fit(items, int(budget * share))
            blocks = {c: [i.text for i in sorted((k for k in kept if k.circuit == c), key=lambda i: i.order)]
                      for c in ("facts", "frames", "turns")}
            return P.build_messages(question, blocks["facts"], blocks["frames"], blocks["turns"], now), len(kept)

        (msgs, kept_n), over = fit_prompt(build, lambda built: fits(built[0]))
        cut += kept_n < len(items)
        trimmed += over
        out[qid] = AnswerPrompt(msgs, P.VERSION)
    if note := trim_note("seem answer", trimmed, len(out)):
        log.warning("%s (RPE passages first, then passages, then facts)", note)
    if cut:
        log.info("seem answer: %d of %d contexts cut to ~%d tokens", cut, len(out), budget // CHARS_PER_TOKEN)
    return out

