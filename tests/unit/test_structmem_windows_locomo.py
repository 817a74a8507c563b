"""On full LoCoMo, turn-level windows (one pseudo-entry per turn) number 272: one per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from structmem_gpu.methods.structmem.windows import count_windows, windows_by_conversation

pytestmark = pytest.mark.locomo


def test_locomo_has_272_windows(locomo_path: Path) -> None:
    from structmem_gpu.data import load_benchmark

    turns, _ = load_benchmark("locomo", locomo_path, None, None)
    frame = turns.rename({"session_time": "event_time"})
    assert count_windows(frame, 3600) == 272
    per_conv = windows_by_conversation(frame, 3600)
    assert len(per_conv) == 10
    for rows, wins in per_conv.values():
        sessions = [set(rows["session_index"][w.start : w.end].to_list()) for w in wins]
        assert all(len(s) == 1 for s in sessions)  # every window is exactly one session
