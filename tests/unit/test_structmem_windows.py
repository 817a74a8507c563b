"""Consolidation windows, seed pools, top-k selection and event reconstruction (pure functions)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl
import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.structmem.windows import (
    Window,
    count_windows,
    greedy_windows,
    reconstruct_events,
    seed_pool,
    top_k_in_pool,
    windows_by_conversation,
)

T0 = datetime(2023, 5, 8, 13, 0)


def entries(sessions: list[tuple[str, datetime, int]]) -> pl.DataFrame:
    """Two entries (fact + relation) per turn; sessions given as (conv_id, time, n_turns)."""
    rows = []
    for s_idx, (conv, when, n) in enumerate(sessions, start=1):
        for t in range(n):
            for kind in ("fact", "relation"):
                rows.append(
                    {
                        "conv_id": conv,
                        "entry_id": f"{conv}:{s_idx}:{t}:{kind}",
                        "event_id": f"{conv}:D{s_idx}:{t}",
                        "event_time": when,
                        "session_index": s_idx,
                        "turn_index": t,
                        "kind": kind,
                    }
                )
    return pl.DataFrame(rows)


def test_sessions_30_minutes_apart_share_a_window_a_day_apart_do_not() -> None:
    df = entries(
        [("c", T0, 2), ("c", T0 + timedelta(minutes=30), 3), ("c", T0 + timedelta(days=1), 2)]
    )
    ((rows, wins),) = windows_by_conversation(df, 3600).values()
    assert [(w.start, w.end) for w in wins] == [(0, 10), (10, 14)]
    assert wins[0].start_time == T0 and wins[0].end_time == T0 + timedelta(minutes=30)
    assert set(rows["session_index"][wins[1].start : wins[1].end].to_list()) == {3}


def test_window_edge_is_inclusive_and_greedy_from_first_start() -> None:
    hour = 3_600_000_000
    # 0 and 1h are together; 1.5h starts a new window (not chained from 1h); 2.5h joins it.
    assert greedy_windows([0, hour, int(1.5 * hour), int(2.5 * hour)], 3600) == [(0, 2), (2, 4)]
    assert greedy_windows([], 3600) == []
    with pytest.raises(ValueError):
        greedy_windows([2, 1], 3600)


def test_conversations_are_windowed_separately() -> None:
    df = entries(
        [("a", T0, 1), ("b", T0 + timedelta(minutes=5), 1), ("a", T0 + timedelta(days=2), 1)]
    )
    assert count_windows(df, 3600) == 3


def _window(start: int, end: int) -> Window:
    return Window("c", 1, start, end, T0, T0)


def test_seed_pools_never_contain_the_buffer() -> None:
    w = _window(4, 7)
    hist, glob = seed_pool(w, 10, "historical"), seed_pool(w, 10, "global")
    assert np.flatnonzero(hist).tolist() == [0, 1, 2, 3]
    assert np.flatnonzero(glob).tolist() == [0, 1, 2, 3, 7, 8, 9]
    with pytest.raises(ConfigError):
        seed_pool(w, 10, "future")


def test_reference_code_seed_pool_keeps_the_buffer() -> None:
    w = _window(4, 7)
    glob = seed_pool(w, 10, "global", exclude_buffer=False)
    assert np.flatnonzero(glob).tolist() == list(range(10))  # the whole conversation
    hist = seed_pool(w, 10, "historical", exclude_buffer=False)
    assert np.flatnonzero(hist).tolist() == [0, 1, 2, 3, 4, 5, 6]
    # a buffer seed comes in itself, but its event siblings inside the buffer do not
    events = ["e0", "e1", "e1", "e2", "e3", "e3", "e4", "e5", "e6", "e7"]
    assert reconstruct_events([4, 0], events, w) == [0, 4]


def test_top_k_in_pool_order_ties_and_bounds() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.9, 0.7, 0.95], dtype=np.float32)
    pool = np.array([True, True, True, True, True, False])
    assert top_k_in_pool(scores, pool, 3) == [
        1,
        3,
        4,
    ]  # ties broken by position; 5 is not in the pool
    assert top_k_in_pool(scores, pool, 1) == [1]
    assert top_k_in_pool(scores, pool, 0) == []
    assert top_k_in_pool(scores, pool, 99) == [1, 3, 4, 2, 0]
    assert top_k_in_pool(scores, np.zeros(6, dtype=bool), 3) == []


def test_reconstruction_returns_whole_events_and_nothing_else() -> None:
    events = ["e0", "e0", "e1", "e2", "e2", "e2", "e3", "e3"]
    w = _window(6, 8)  # buffer = e3's entries
    got = reconstruct_events([4, 2], events, w)
    assert got == [2, 3, 4, 5]  # all of e2 and e1, time order, deduplicated
    assert reconstruct_events([], events, w) == []


def test_reconstruction_never_pulls_in_the_buffer() -> None:
    events = ["e0", "e1", "e1", "e2"]
    w = _window(2, 4)  # an (artificial) event split across the buffer edge
    assert reconstruct_events([1], events, w) == [1]


def test_sample_turn_level_windows(sample_path) -> None:
    from structmem_gpu.data import load_benchmark

    turns, _ = load_benchmark("sample", sample_path, None, None)
    # sample-1 sessions 2 and 3 are 43 minutes apart: 5 + 4 sessions -> 4 + 4 windows.
    assert count_windows(turns.rename({"session_time": "event_time"}), 3600) == 8
    assert count_windows(turns.rename({"session_time": "event_time"}), 0) == 9
