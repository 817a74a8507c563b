"""The `turns` table in two layouts, and the one accessor every reader goes through.

    turns = RunDir(run_dir).read_table("turns")     # plain frame with schemas.TURNS, either layout

- **plain** (LoCoMo, the sample): `tables/turns.parquet`, one row per turn, as always.
- **compact** (LongMemEval): each distinct session's turns are stored once, in
  `tables/turn_sessions.parquet` (one row per turn of a distinct session, keyed by
  `session_key`), and `tables/turn_haystacks.parquet` maps each conversation (= question) to
  its sessions in order (conv_id, session_index, session_key). LongMemEval-M lists 500
  sessions per question drawn from a shared pool, so the plain layout repeats each session
  ~12x (500 questions); the compact one grows with distinct sessions.

`RunDir.read_table("turns")` / `has_table` / `table_sha256` accept both (artifacts.py), so a
stage that declares `reads=("turns",)` and calls `ctx.read("turns")` sees the same frame in
either layout: `CompactTurns.expand()` rebuilds exactly the rows, order and dtypes the plain
loader wrote (tests/unit/test_turns_store.py compares with main's loader output). Readers
that want the compact form without expanding (sharding, per-session work) call
`read_compact(run)`.

session_key = hash of what a turn row holds beyond its conversation: session id, session
hash (turn texts + date), dia_ids and `has_answer` flags. Two haystacks that list the same
session with the same date and flags share one key; anything else that differs gives a new
key, so the expansion never merges rows the plain layout kept apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.core.hashing import stable_hash


class _Tables(Protocol):
    """What these helpers need of artifacts.RunDir (which imports this module)."""

    def table_path(self, name: str) -> Any: ...
    def read_table(self, name: str) -> pl.DataFrame: ...

__all__ = ["PARTS", "CompactTurns", "SessionStore", "read_compact", "session_key"]

LOGICAL = "turns"
PARTS = ("turn_sessions", "turn_haystacks")  # the compact layout's two files, in write order
_CONV_COLUMNS = ("conv_id", "session_index", "event_id")  # what the haystack mapping supplies
SESSION_COLUMNS = ("session_key", *(c for c in schemas.TURNS if c not in _CONV_COLUMNS))


def session_key(session_id: str, session_hash: str, dia_ids: Sequence[str],
                has_answer: Sequence[bool | None]) -> str:
    return stable_hash("turn-session", session_id, session_hash, list(dia_ids), list(has_answer))


@dataclass(frozen=True)
class CompactTurns:
    """Distinct sessions' turns (schemas.TURN_SESSIONS) + the conversation -> session map
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

    def expand(self) -> pl.DataFrame:
        """The plain turns frame (schemas.TURNS), rows in the order the plain loader writes."""
        import numpy as np  # the gather index: one vectorised repeat instead of a Python loop

        if self.haystacks.height == 0:
            return schemas.empty(schemas.TURNS)
        j = self._lengths()
        lens = j["_len"].to_numpy().astype(np.int64)
        starts = j["_start"].to_numpy().astype(np.int64)
        total = int(lens.sum())
        offsets = np.cumsum(lens) - lens
        rows = np.arange(total, dtype=np.int64) - np.repeat(offsets, lens) + np.repeat(starts, lens)
        owner = np.repeat(np.arange(j.height, dtype=np.int64), lens)
        body = self.sessions.select(pl.all().gather(pl.Series(rows)))
        conv = j.select(pl.col("conv_id").gather(pl.Series(owner)),
                        pl.col("session_index").gather(pl.Series(owner)))
        out = pl.concat([body, conv], how="horizontal").with_columns(
            (pl.col("conv_id") + ":" + pl.col("dia_id")).alias("event_id"))
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
        per_key = self.sessions.group_by("session_key").agg(
            pl.col("session_hash").first(), chars.sum().alias("v"))
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
    """Builds CompactTurns while a loader streams: each distinct session's rows are kept once.

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
        equal session is stored already. Returns its session_key."""
        first = rows[0]
        key = session_key(first.session_id, first.session_hash,
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
        self._hay["conv_id"].append(conv_id)
        self._hay["session_index"].append(session_index)
        self._hay["session_key"].append(key)
        return key

    def add_known(self, conv_id: str, session_index: int, key: str) -> None:
        """Map `conv_id`'s session `session_index` to a session stored already."""
        if key not in self._keys:
            raise KeyError(f"session_key {key!r} is not stored")
        self._hay["conv_id"].append(conv_id)
        self._hay["session_index"].append(session_index)
        self._hay["session_key"].append(key)

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
    return CompactTurns(s, h)


def turn_conversations(run: _Tables) -> list[str]:
    """conv_ids of `run`'s turns without expanding them (merge checks, counts)."""
    if run.table_path(LOGICAL).exists():
        path, col = run.table_path(LOGICAL), "conv_id"
    else:
        path, col = run.table_path(PARTS[1]), "conv_id"
    return (pl.scan_parquet(path, glob=False).select(col).unique(maintain_order=True)
            .collect()[col].to_list())
