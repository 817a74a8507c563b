"""SEEM passages: one passage per dialogue turn, with provenance ids (docs/methods.md
"SEEM: passages").

    >>> p = passages_from_turns(turns).row(0, named=True)
    {"pid": "sample-1:D1:1", "conv_id": "sample-1", "position": 0, "session_index": 1,
     "turn_index": 0, "session_time": datetime(2024, 3, 3, 14, 15), "speaker": "Lena",
     "text": "Hey Tomas! Big news: ...", "image_caption": None}

The passage id is the turn's `event_id` (`<conv_id>:<dia_id>`), so every frame, fact and
retrieval resolves to a row of turns.parquet. `request_groups` packs consecutive passages of
one session into requests of `seem.passages_per_request` (1 = the spec; more is the CI
deviation that shares one instruction block between several passages).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from structmem_gpu.data import display_text
from structmem_gpu.methods.seem.schemas import PASSAGES


@dataclass(frozen=True)
class Passage:
    pid: str
    conv_id: str
    position: int  # chronological index inside the conversation
    session_index: int
    turn_index: int
    session_time: datetime | None
    speaker: str
    text: str
    image_caption: str | None

    @property
    def display(self) -> str:
        return display_text(self.text, self.image_caption)

    @property
    def embedding_text(self) -> str:
        """What the passage's vector is computed from: the raw text prefixed with the speaker."""
        return f"{self.speaker}: {self.display}"

    @property
    def prompt_tuple(self) -> tuple[str, str, str | None]:
        return (self.speaker, self.text, self.image_caption)


def passages_from_turns(turns: pl.DataFrame) -> pl.DataFrame:
    """PASSAGES rows in (conv_id, session, turn) order with a per-conversation position."""
    ordered = turns.sort("conv_id", "session_index", "turn_index")
    out = ordered.select(
        pl.col("event_id").alias("pid"), "conv_id",
        (pl.int_range(pl.len()).over("conv_id")).cast(pl.Int32).alias("position"),
        "session_index", "turn_index", "session_time", "speaker",
        pl.col("text").fill_null(""), "image_caption",
    )
    return out.select([pl.col(c).cast(t) for c, t in PASSAGES.items()])


def passage_list(df: pl.DataFrame) -> list[Passage]:
    ordered = df.sort("conv_id", "position")
    return [Passage(**{k: r[k] for k in PASSAGES}) for r in ordered.iter_rows(named=True)]


def by_conversation(passages: Sequence[Passage]) -> dict[str, list[Passage]]:
    """conv_id -> its passages in chronological order (conversations sorted by id)."""
    out: dict[str, list[Passage]] = {}
    for p in sorted(passages, key=lambda p: (p.conv_id, p.position)):
        out.setdefault(p.conv_id, []).append(p)
    return out


def request_groups(passages: Sequence[Passage], per_request: int) -> list[tuple[Passage, ...]]:
    """Consecutive passages of one session, `per_request` at a time (one session time per request)."""
    out: list[tuple[Passage, ...]] = []
    ordered = sorted(passages, key=lambda p: (p.conv_id, p.position))
    for _, session in itertools.groupby(ordered, key=lambda p: (p.conv_id, p.session_index)):
        rows = list(session)
        out.extend(tuple(rows[i : i + per_request]) for i in range(0, len(rows), per_request))
    return out


def passage_index(passages: Sequence[Passage]) -> dict[str, Passage]:
    return {p.pid: p for p in passages}


def row_dict(p: Passage) -> dict[str, Any]:
    return {k: getattr(p, k) for k in PASSAGES}
