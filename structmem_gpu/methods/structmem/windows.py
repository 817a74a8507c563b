"""Consolidation windows, seed pools, seed selection and event reconstruction (pure functions).

docs/methods.md "StructMem: consolidation" steps 1, 4 and 5, without any LLM or encoder, so the
rules can be tested directly and the LoCoMo window count checked at turn level:

    turns = load_benchmark("locomo", path, None, None)[0]
    count_windows(turns.rename({"session_time": "event_time"}), 3600)   # -> 272

One window of the bundled sample (sessions 2 and 3 of sample-1 are 43 minutes apart, so they
share a window):

    Window(conv_id="sample-1", index=1, start=7, end=20,
           start_time=datetime(2024, 3, 17, 19, 5), end_time=datetime(2024, 3, 17, 19, 48))

Positions (`start`, `end`) index the conversation's entries sorted by `sort_entries`; since the
windows are greedy over that order, each window is a contiguous slice and every entry before
`start` lies strictly before the window's start time (the `historical` seed pool).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import polars as pl

from structmem_gpu.core.errors import ConfigError

SEED_SCOPES = ("historical", "global")


@dataclass(frozen=True)
class Window:
    conv_id: str
    index: int  # 0-based, in time order within the conversation
    start: int  # first position in the sorted entries (inclusive)
    end: int  # last position + 1
    start_time: datetime  # time of the first entry
    end_time: datetime  # time of the last entry


def sort_entries(df: pl.DataFrame, time_col: str = "event_time") -> pl.DataFrame:
    """One conversation's rows in consolidation order: (time, session, turn), then stable ties."""
    keys = [
        c for c in (time_col, "session_index", "turn_index", "kind", "entry_id") if c in df.columns
    ]
    return df.sort(keys, maintain_order=True)


def greedy_windows(
    times_us: Sequence[int] | np.ndarray, window_seconds: float
) -> list[tuple[int, int]]:
    """(start, end) slices over sorted times: a window starts at the first unassigned time and
    takes every time within `window_seconds` of it (inclusive)."""
    t = np.asarray(times_us, dtype=np.int64)
    if t.size and np.any(np.diff(t) < 0):
        raise ValueError("greedy_windows needs times sorted ascending")
    width = round(float(window_seconds) * 1_000_000)
    out: list[tuple[int, int]] = []
    start = 0
    while start < t.size:
        end = int(np.searchsorted(t, t[start] + width, side="right"))
        out.append((start, end))
        start = end
    return out


def conversation_windows(
    conv_id: str, sorted_df: pl.DataFrame, window_seconds: float, time_col: str = "event_time"
) -> list[Window]:
    """Windows of one conversation whose rows are already in `sort_entries` order."""
    times = sorted_df[time_col]
    micros = times.dt.epoch("us").to_numpy()
    out = []
    for i, (a, b) in enumerate(greedy_windows(micros, window_seconds)):
        out.append(Window(conv_id, i, a, b, times[a], times[b - 1]))
    return out


def windows_by_conversation(
    df: pl.DataFrame, window_seconds: float, time_col: str = "event_time"
) -> dict[str, tuple[pl.DataFrame, list[Window]]]:
    """conv_id -> (its rows in consolidation order, its windows); conversations sorted by id."""
    if window_seconds < 0:
        raise ConfigError(f"consolidate.window_seconds={window_seconds} must be >= 0")
    out = {}
    for (conv_id,), part in sorted(df.group_by("conv_id"), key=lambda kv: str(kv[0][0])):
        ordered = sort_entries(part, time_col)
        out[str(conv_id)] = (
            ordered,
            conversation_windows(str(conv_id), ordered, window_seconds, time_col),
        )
    return out


def count_windows(df: pl.DataFrame, window_seconds: float, time_col: str = "event_time") -> int:
    """Total windows over all conversations of an entries (or turns) frame."""
    return sum(len(w) for _, w in windows_by_conversation(df, window_seconds, time_col).values())


def seed_pool(window: Window, n: int, scope: str, exclude_buffer: bool = True) -> np.ndarray:
    """Boolean mask over the n sorted positions that may seed `window`.

    The buffer is excluded unless `exclude_buffer=False` (what the reference code effectively
    does: its buffer filter is broken, docs/methods.md "StructMem: reference code")."""
    if scope not in SEED_SCOPES:
        raise ConfigError(f"consolidate.seed_scope={scope!r}; expected one of {list(SEED_SCOPES)}")
    mask = np.zeros(n, dtype=bool)
    if scope == "historical":
        mask[: window.start] = True  # everything before the window's first entry
    else:
        mask[:] = True
    if exclude_buffer:
        mask[window.start : window.end] = False
    else:
        mask[window.start : window.end] = True
    return mask


def top_k_in_pool(scores: np.ndarray, pool: np.ndarray, k: int) -> list[int]:
    """Positions of the k best scores inside the pool, best first (ties: earlier position)."""
    cand = np.flatnonzero(pool)
    if k <= 0 or cand.size == 0:
        return []
    s = scores[cand]
    if cand.size > k:
        # argpartition keeps this O(n); the exact order is fixed by the lexsort below.
        part = np.argpartition(-s, k - 1)[:k]
        threshold = s[part].min()
        keep = s >= threshold  # keep all ties at the boundary so the tie-break is by position
        cand, s = cand[keep], s[keep]
    order = np.lexsort((cand, -s))
    return [int(p) for p in cand[order][:k]]


def event_index(event_ids: Sequence[str]) -> dict[str, list[int]]:
    """event_id -> its positions (ascending); built once per conversation."""
    out: dict[str, list[int]] = {}
    for p, ev in enumerate(event_ids):
        out.setdefault(ev, []).append(p)
    return out


def reconstruct_events(
    seeds: Sequence[int],
    event_ids: Sequence[str],
    window: Window,
    by_event: Mapping[str, Sequence[int]] | None = None,
) -> list[int]:
    """Every position sharing an event_id with a seed (the seeds included), deduplicated, in
    time order (Eq. 4-5). Event siblings inside the buffer are skipped; a seed that is itself
    in the buffer (only with `seed_exclude_buffer=false`) is kept, as the reference code does
    (docs/methods.md "StructMem: reference code")."""
    by_event = event_index(event_ids) if by_event is None else by_event
    found = {p for s in seeds for p in by_event[event_ids[s]]}
    kept = {p for p in found if not window.start <= p < window.end}
    return sorted(kept | set(seeds))
