"""Extraction windows: consecutive turns of a session (or a segment stage's batch) that one
extraction request reads, planned by turn count or packed up to a token budget (a longer turn
split into parts), with the read-only context turns before them. Pure functions: the extract
stage (extract.py), the dry run and the graph-memory baseline plan the same windows.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import polars as pl

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.data import display_text
from structmem_gpu.llm.tokens import chars_tokens
from structmem_gpu.methods.structmem.packing import pack_lengths, split_text
from structmem_gpu.prompts import render_window


@dataclass(frozen=True)
class TurnView:
    """One turn as extraction sees it (text already carries its image caption)."""

    event_id: str
    dia_id: str
    session_index: int
    turn_index: int
    session_time: datetime
    speaker: str
    text: str
    part: int = 0  # 1.. = a part of a turn longer than the window budget; 0 = the whole turn


@dataclass(frozen=True)
class ExtractionWindow:
    conv_id: str
    session_index: int
    session_time: datetime
    turns: tuple[TurnView, ...]  # numbered 1..n in the prompt
    context: tuple[TurnView, ...]  # earlier turns of the session, shown read-only
    # extract.input=segments: (topic number, turns in it) per topic segment of the batch, in
    # order (the reference's "--- Topic N ---" markers); () = one window of one session.
    topics: tuple[tuple[int, int], ...] = ()
    # Reference rendering of a batch sent by the same add_memory call as the batches before it
    # (extract.input=segments): its first source id and, per session time, the turns of that
    # session those batches held (its seconds continue from there). 0 / () = a call's first.
    number_from: int = 0
    seconds_from: tuple[tuple[datetime, int], ...] = ()


def _turn_view(row: dict[str, Any]) -> TurnView:
    return TurnView(
        row["event_id"],
        row["dia_id"],
        row["session_index"],
        row["turn_index"],
        row["session_time"],
        row["speaker"],
        display_text(row["text"] or "", row["image_caption"]),
    )


def _line(v: TurnView) -> str:
    return f"{v.speaker}: {v.text}"


def _line_counter(speaker: str, count_tokens: Callable[[str], int]) -> Callable[[str], int]:
    """Tokens of a text as its "Speaker: text" line (what a window's budget counts)."""
    return lambda text: count_tokens(f"{speaker}: {text}")


def split_long_turns(
    views: Sequence[TurnView], budget: int, count_tokens: Callable[[str], int]
) -> list[TurnView]:
    """Each turn longer than `budget` tokens as consecutive parts that fit it, each keeping the
    turn's ids and speaker (an entry from any part cites the turn); other turns unchanged."""
    out: list[TurnView] = []
    for v in views:
        if count_tokens(_line(v)) <= budget:
            out.append(v)
            continue
        pieces = split_text(v.text, budget, _line_counter(v.speaker, count_tokens))
        out.extend(replace(v, text=p, part=i) for i, p in enumerate(pieces, 1))
    return out


def bound_context(
    context: Sequence[TurnView], budget: int, count_tokens: Callable[[str], int]
) -> tuple[TurnView, ...]:
    """Context turns as shown: a split turn (its parts) appears once, as the tail of its last
    part of at most budget / 2 tokens (what directly precedes the window); whole turns as is."""
    out: list[TurnView] = []
    for i, v in enumerate(context):
        if not v.part:
            out.append(v)
        elif i + 1 == len(context) or context[i + 1].event_id != v.event_id:
            tail = split_text(v.text, budget // 2, _line_counter(v.speaker, count_tokens))[-1]
            out.append(replace(v, text=tail))
    return tuple(out)


def plan_windows(
    turns: pl.DataFrame,
    per_request: int | None,
    context_turns: int,
    window_tokens: int | None = None,
    count_tokens: Callable[[str], int] = chars_tokens,
) -> list[ExtractionWindow]:
    """Windows of consecutive turns inside each session, in (conv_id, session, turn) order:
    `per_request` turns each, or (with `window_tokens`) packed up to that many tokens of
    "Speaker: text" lines, at most `per_request` turns when that is set too. With
    `window_tokens`, a longer turn is split into parts first, so every window stays within
    the budget, and a split turn in the context is a bounded excerpt (`bound_context`)."""
    if per_request is None and window_tokens is None:
        raise ValueError("plan_windows needs per_request or window_tokens")
    ordered = turns.sort("conv_id", "session_index", "turn_index")
    out = []
    keyed = itertools.groupby(
        ordered.iter_rows(named=True), key=lambda r: (r["conv_id"], r["session_index"])
    )
    for (conv_id, session_index), rows in keyed:
        views = [_turn_view(r) for r in rows]
        if window_tokens is None:
            assert per_request is not None
            spans = [(a, a + per_request) for a in range(0, len(views), per_request)]
        else:
            views = split_long_turns(views, window_tokens, count_tokens)
            lengths = [count_tokens(_line(v)) for v in views]
            spans = pack_lengths(lengths, window_tokens, per_request)
        for start, end in spans:
            context = views[max(0, start - context_turns) : start]
            if window_tokens is not None:
                context = bound_context(context, window_tokens, count_tokens)
            out.append(
                ExtractionWindow(
                    conv_id,
                    session_index,
                    views[0].session_time,
                    tuple(views[start:end]),
                    tuple(context),
                )
            )
    return out


def with_compressed(turns: pl.DataFrame, compressed: pl.DataFrame) -> pl.DataFrame:
    """`turns` whose text is the compress stage's result (which already carries the image
    caption as the reference appends it, so the caption column is cleared)."""
    comp = compressed.select("event_id", pl.col("compressed").alias("_compressed"))
    out = turns.join(comp, on="event_id", how="left")
    absent = out.filter(pl.col("_compressed").is_null())
    if absent.height:
        raise ConfigError(f"tables/compressed_turns.parquet lacks turn {absent['event_id'][0]} "
                          f"({absent.height} turns): rerun the compress stage")
    return out.with_columns(pl.col("_compressed").alias("text"),
                            pl.lit(None, pl.String).alias("image_caption")).drop("_compressed")


def segment_windows(turns: pl.DataFrame, segments: pl.DataFrame) -> list[ExtractionWindow]:
    """One window per extraction batch of the segment stage, in (conv_id, batch) order; its
    turns in segment order, its topics numbered by segment index (lost segments: none)."""
    views = {r["event_id"]: _turn_view(r) for r in turns.iter_rows(named=True)}
    kept = segments.filter(pl.col("batch_index").is_not_null()).sort("conv_id", "segment_index")
    if "batch_released_at" not in kept.columns:  # segmented before the column: one call each
        kept = kept.with_columns(pl.lit(None, pl.String).alias("batch_released_at"))
    out = []
    call: tuple[str, Any] | None = None
    number_from, seconds = 0, Counter[datetime]()
    for (conv_id, _), frame in kept.group_by(["conv_id", "batch_index"], maintain_order=True):
        topics, ts = [], []
        for seg in frame.iter_rows(named=True):
            topics.append((int(seg["segment_index"]), len(seg["event_ids"])))
            ts += [views[e] for e in seg["event_ids"]]
        if not ts:
            continue
        released = frame["batch_released_at"][0]
        if released is None or call != (conv_id, released):  # a new add_memory call
            call, number_from, seconds = (conv_id, released), 0, Counter()
        out.append(ExtractionWindow(str(conv_id), ts[0].session_index, ts[0].session_time,
                                    tuple(ts), (), tuple(topics), number_from,
                                    tuple(sorted(seconds.items()))))
        number_from += len(ts)
        seconds.update(t.session_time for t in ts)
    return sorted(out, key=lambda w: (w.conv_id, w.turns[0].session_index, w.turns[0].turn_index))


def window_plan_hash(windows: Sequence[ExtractionWindow]) -> str:
    """A digest of the windows (turns, parts and their texts): equal digests = the same windows
    (the manifest's extract notes and the dry run both show it)."""
    return stable_hash(
        [
            [w.conv_id, w.session_index, [[t.event_id, t.part, t.text] for t in w.turns],
             [[t.event_id, t.part, t.text] for t in w.context]]
            for w in windows
        ],
        length=16,
    )


def render_batch(turns: Sequence[TurnView]) -> str:
    """An extraction batch (extract.input=segments, our prompts), which may span sessions:
    each session's run of turns under its own "Session date" line, turns numbered through."""
    parts: list[str] = []
    numbered = list(enumerate(turns, start=1))
    for when, group in itertools.groupby(numbered, key=lambda it: it[1].session_time):
        items = list(group)
        block = render_window(when, [], [(t.speaker, t.text) for _, t in items]).splitlines()
        head = [line for line in block if not line.startswith("[")]
        parts.append("\n".join([*head, *(f"[{n}] {t.speaker}: {t.text}" for n, t in items)]))
    return "\n\n".join(parts)
