"""The `turns` table in two layouts, and the one accessor every reader goes through.

    turns = RunDir(run_dir).read_table("turns")     # plain frame with schemas.TURNS, either layout

- **plain** (LoCoMo, the sample): `tables/turns.parquet`, one row per turn, as always.
- **compact** (LongMemEval): each distinct session *content* (id + turns + flags) is stored
  once, in `tables/turn_sessions.parquet` (one row per turn, keyed by `session_key`), and
  `tables/turn_haystacks.parquet` has one row per occurrence: conversation (= question),
  position, session_key, and the occurrence's date (`session_time`) and `session_hash` (turns
  + date). LongMemEval-M lists 500 sessions per question drawn from a shared pool and its
  recipe draws each haystack's dates afresh, so a pool session recurs ~12x (500 questions)
  with a different date each time: the plain layout repeats its turns per occurrence, the
  compact one stores them once and the dates per occurrence (issue 43).

`RunDir.read_table("turns")` / `has_table` / `table_sha256` accept both (artifacts.py), so a
stage that declares `reads=("turns",)` and calls `ctx.read("turns")` sees the same frame in
either layout: `CompactTurns.expand()` rebuilds exactly the rows, order and dtypes the plain
loader wrote (tests/unit/test_turns_store.py compares with main's loader output). Readers
that want the compact form without expanding (sharding, per-session work) call
`read_compact(run)`; `dated_sessions()` gives each distinct (content, date) once, for work
whose prompt carries the date (StructMem's extraction).

session_key = hash of what a turn row holds beyond its conversation and date: session id,
turns (speaker, text, caption), dia_ids and `has_answer` flags. Anything that differs gives a
new key, so the expansion never merges rows the plain layout kept apart.

Migration: run directories written before content keying (turn_sessions carried
session_hash/session_time, one key per (turns, date)) are read as they are: `read_compact`
moves those two columns onto the haystack rows. Their table hash differs from a new load's,
so a resumed LongMemEval run re-runs its stages after `load` once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Protocol

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.core.hashing import stable_hash


class _Tables(Protocol):
    """What these helpers need of artifacts.RunDir (which imports this module)."""

    def table_path(self, name: str) -> Any: ...
    def read_table(self, name: str) -> pl.DataFrame: ...

__all__ = ["PARTS", "CompactTurns", "SessionStore", "dated_key", "read_compact", "session_key"]

LOGICAL = "turns"
PARTS = ("turn_sessions", "turn_haystacks")  # the compact layout's two files, in write order
DATED = ("session_hash", "session_time")  # per occurrence: on the haystack rows
SESSION_COLUMNS = tuple(schemas.TURN_SESSIONS)


def session_key(session_id: str, turns: Sequence[tuple[str, str, str | None]],
                dia_ids: Sequence[str], has_answer: Sequence[bool | None]) -> str:
    """The content key: `turns` = (speaker, text, image_caption) per turn; no date."""
    return stable_hash("turn-content", session_id, [list(t) for t in turns], list(dia_ids),
                       list(has_answer))


def dated_key(session_id: str, session_hash: str, dia_ids: Sequence[str],
              has_answer: Sequence[bool | None]) -> str:
    """One (content, date) occurrence's name: the session_key of the layout before content
    keying. StructMem's per-session extraction names its one-session pseudo-conversations by
    it, so its plan order (sorted by that name) and request ids are what they were."""
    return stable_hash("turn-session", session_id, session_hash, list(dia_ids), list(has_answer))


@dataclass(frozen=True)
class CompactTurns:
    """Distinct session contents' turns (schemas.TURN_SESSIONS) + one row per occurrence
    (schemas.TURN_HAYSTACKS, rows in conversation order, then session order)."""

    sessions: pl.DataFrame
    haystacks: pl.DataFrame

    def _lengths(self) -> pl.DataFrame:
        """Per haystack row: start row of its session in `sessions` and its turn count."""
        spans = (self.sessions.with_row_index("_row")
                 .group_by("session_key").agg(pl.col("_row").min().alias("_start"),
                                              pl.len().alias("_len")))
        joined = (self.haystacks.with_row_index("_h")
                  .join(spans, on="session_key", how="left").sort("_h"))
        if joined["_len"].null_count():
            bad = joined.filter(pl.col("_len").is_null()).row(0, named=True)
            raise ValueError(f"turn_haystacks names session_key {bad['session_key']!r} "
                             f"({bad['conv_id']}) that turn_sessions lacks")
        return joined

    @property
    def turn_count(self) -> int:
        """Rows of the expanded (plain) table."""
        if self.haystacks.height == 0:
            return 0
        return int(self._lengths()["_len"].sum())

    def expand(self, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The plain turns frame (schemas.TURNS), rows in the order the plain loader writes;
        only `columns` (in schema order) when given: a reader that needs ids and positions
        never pays for the texts of every occurrence."""
        import numpy as np  # the gather index: one vectorised repeat instead of a Python loop

        want = list(schemas.TURNS) if columns is None else [c for c in schemas.TURNS
                                                            if c in set(columns)]
        if self.haystacks.height == 0:
            return schemas.empty(schemas.TURNS).select(want)
        j = self._lengths()
        lens = j["_len"].to_numpy().astype(np.int64)
        starts = j["_start"].to_numpy().astype(np.int64)
        total = int(lens.sum())
        offsets = np.cumsum(lens) - lens
        rows = np.arange(total, dtype=np.int64) - np.repeat(offsets, lens) + np.repeat(starts, lens)
        owner = pl.Series(np.repeat(np.arange(j.height, dtype=np.int64), lens))
        need = set(want) | ({"conv_id", "dia_id"} if "event_id" in want else set())
        body = self.sessions.select(pl.col(c).gather(pl.Series(rows))
                                    for c in self.sessions.columns if c in need)
        occ = j.select(pl.col(c).gather(owner) for c in ("conv_id", "session_index", *DATED)
                       if c in need)
        out = pl.concat([body, occ], how="horizontal")
        if "event_id" in want:
            out = out.with_columns((pl.col("conv_id") + ":" + pl.col("dia_id")).alias("event_id"))
        schema = {c: schemas.TURNS[c] for c in want}
        return schemas.conform(out.select(want), schema)

    def dated_keys(self) -> pl.DataFrame:
        """Each distinct (content, date) once: session_key, session_hash, session_time and its
        `dated_key`, in order of first occurrence."""
        firsts = (self.haystacks.select("session_key", *DATED)
                  .unique(maintain_order=True).with_row_index("_o"))
        ids = self.sessions.group_by("session_key", maintain_order=True).agg(
            pl.col("session_id").first(), pl.col("dia_id"), pl.col("has_answer"))
        named = firsts.join(ids, on="session_key", how="left").sort("_o")
        keys = [dated_key(sid, h, dia, flags) for sid, h, dia, flags in
                named.select("session_id", "session_hash", "dia_id", "has_answer").iter_rows()]
        return named.select("session_key", *DATED).with_columns(pl.Series("dated_key", keys))

    def dated_sessions(self, keys: pl.DataFrame | None = None) -> pl.DataFrame:
        """Each distinct (content, date) as a one-session plain turns frame: conv_id = its
        dated_key, session_index 1, event_id "<dated_key>:<dia_id>"; in order of first
        occurrence. For work whose prompt carries the session date (StructMem's extraction).
        `keys`: `dated_keys()` when the caller has it already."""
        keys = self.dated_keys() if keys is None else keys
        out = (keys.with_row_index("_o").rename({"dated_key": "conv_id"})
               .join(self.sessions.with_row_index("_t"), on="session_key", how="inner")
               .sort("_o", "_t")
               .with_columns(pl.lit(1, dtype=pl.Int32).alias("session_index"),
                             (pl.col("conv_id") + ":" + pl.col("dia_id")).alias("event_id")))
        return schemas.conform(out.select(list(schemas.TURNS)), schemas.TURNS)

    def filter_conversations(self, keep: Iterable[str]) -> "CompactTurns":
        """Only these conversations, and only the sessions they still use."""
        hay = self.haystacks.filter(pl.col("conv_id").is_in(list(keep)))
        used = hay["session_key"].unique().to_list()
        return CompactTurns(self.sessions.filter(pl.col("session_key").is_in(used)), hay)

    def session_volumes(self) -> dict[str, dict[str, int]]:
        """conv -> {session_hash: chars of its turns}, as load.shard_volumes computes it."""
        chars = (pl.col("text").str.len_chars().fill_null(0)
                 + pl.col("image_caption").str.len_chars().fill_null(0))
        per_key = self.sessions.group_by("session_key").agg(chars.sum().alias("v"))
        per = (self.haystacks.join(per_key, on="session_key", how="left")
               .group_by("conv_id", "session_hash").agg(pl.col("v").sum())
               .sort("conv_id", "session_hash"))
        out: dict[str, dict[str, int]] = {}
        for conv, h, v in per.iter_rows():
            out.setdefault(conv, {})[h] = int(v)
        return out

    def conversations(self) -> list[str]:
        return self.haystacks["conv_id"].unique(maintain_order=True).to_list()

    @classmethod
    def from_turns(cls, turns: pl.DataFrame) -> "CompactTurns":
        """Split a plain turns frame (any benchmark); `expand()` gives it back unchanged."""
        store = SessionStore()
        for (conv,), rows in turns.with_row_index("_r").group_by("conv_id", maintain_order=True):
            for (_,), sess in rows.group_by("session_index", maintain_order=True):
                first = sess.row(0, named=True)
                rows = [SimpleNamespace(**r) for r in sess.drop("_r").to_dicts()]
                store.add(str(conv), int(first["session_index"]), rows)
        return store.finish()


class SessionStore:
    """Builds CompactTurns while a loader streams: each distinct content's rows are kept once,
    each occurrence is one haystack row (with its date and session_hash).

    Rows are flushed into an Arrow-backed frame every `flush_rows` turns, so the Python
    objects of at most that many turns are alive at a time (the rest is compact Arrow text).
    """

    def __init__(self, flush_rows: int = 20_000) -> None:
        self.flush_rows = flush_rows
        self._keys: set[str] = set()
        self._cols: dict[str, list[Any]] = {c: [] for c in SESSION_COLUMNS}
        self._frames: list[pl.DataFrame] = []
        self._hay: dict[str, list[Any]] = {c: [] for c in schemas.TURN_HAYSTACKS}

    def add(self, conv_id: str, session_index: int, rows: Sequence[Any]) -> str:
        """Record that `conv_id`'s session `session_index` has these turns (objects with the
        schemas.TURNS session/turn attributes, e.g. data.common.Turn); store them unless an
        equal content is stored already. Returns its session_key."""
        first = rows[0]
        key = session_key(first.session_id, [(r.speaker, r.text, r.image_caption) for r in rows],
                          [r.dia_id for r in rows], [r.has_answer for r in rows])
        if key not in self._keys:
            self._keys.add(key)
            cols = self._cols
            for r in rows:
                cols["session_key"].append(key)
                for c in SESSION_COLUMNS[1:]:
                    cols[c].append(getattr(r, c))
            if len(cols["session_key"]) >= self.flush_rows:
                self._flush()
        self._occurrence(conv_id, session_index, key, first.session_hash, first.session_time)
        return key

    def add_known(self, conv_id: str, session_index: int, key: str, session_hash: str,
                  session_time: datetime) -> None:
        """Map `conv_id`'s session `session_index` to a content stored already, at this date."""
        if key not in self._keys:
            raise KeyError(f"session_key {key!r} is not stored")
        self._occurrence(conv_id, session_index, key, session_hash, session_time)

    def _occurrence(self, conv_id: str, session_index: int, key: str, session_hash: str,
                    session_time: datetime) -> None:
        hay = self._hay
        hay["conv_id"].append(conv_id)
        hay["session_index"].append(session_index)
        hay["session_key"].append(key)
        hay["session_hash"].append(session_hash)
        hay["session_time"].append(session_time)

    def _flush(self) -> None:
        if self._cols["session_key"]:
            self._frames.append(pl.DataFrame(self._cols, schema=dict(schemas.TURN_SESSIONS)))
            self._cols = {c: [] for c in SESSION_COLUMNS}

    def finish(self) -> CompactTurns:
        self._flush()
        sessions = (pl.concat(self._frames, rechunk=True) if self._frames
                    else schemas.empty(schemas.TURN_SESSIONS))
        self._frames = []
        hay = pl.DataFrame(self._hay, schema=dict(schemas.TURN_HAYSTACKS))
        return CompactTurns(sessions, hay)


def has_compact(run: _Tables) -> bool:
    return all(run.table_path(p).exists() for p in PARTS)


def read_compact(run: _Tables) -> CompactTurns:
    """The compact layout of `run`'s turns (a plain turns.parquet is split on the fly)."""
    if run.table_path(LOGICAL).exists():
        return CompactTurns.from_turns(run.read_table(LOGICAL))
    s, h = (pl.read_parquet(run.table_path(p), glob=False) for p in PARTS)
    if DATED[0] in s.columns:  # written before content keying: dates move to the occurrences
        dates = s.group_by("session_key").agg(pl.col(c).first() for c in DATED)
        h = schemas.conform(h.join(dates, on="session_key", how="left"), schemas.TURN_HAYSTACKS)
        s = s.drop(*DATED)
    return CompactTurns(s, h)


def turn_conversations(run: _Tables) -> list[str]:
    """conv_ids of `run`'s turns without expanding them (merge checks, counts)."""
    if run.table_path(LOGICAL).exists():
        path, col = run.table_path(LOGICAL), "conv_id"
    else:
        path, col = run.table_path(PARTS[1]), "conv_id"
    return (pl.scan_parquet(path, glob=False).select(col).unique(maintain_order=True)
            .collect()[col].to_list())
