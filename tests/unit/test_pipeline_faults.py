"""Faults a cluster job meets, on the scripted LLM: requests without a reply make a stage
incomplete (never done) and a plain rerun re-sends only those; a stop signal ends a stage
without writing its tables; a full disk leaves the old table in place."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest

from structmem_gpu.core import preempt
from structmem_gpu.core.artifacts import RunDir, WriteError, atomic_write_parquet
from structmem_gpu.core.errors import StageIncompleteError
from structmem_gpu.llm import scripted
from structmem_gpu.llm.scripted import ScriptedFailure
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.core.preempt import Preempted
from tests.fixtures.pipeline import run_pipeline


class Outage:
    """Scripted server that gives no reply to every other extract request while `down`."""

    def __init__(self) -> None:
        self.down = True
        self.calls: list[str] = []
        self.stop_after: int | None = None  # request a stop signal after this many replies

    def __call__(self, req: LLMRequest) -> None:
        self.calls.append(req.request_id)
        if self.stop_after is not None and len(self.calls) > self.stop_after:
            preempt.request_stop("SIGTERM")
        lost = int(hashlib.sha256(req.request_id.encode()).hexdigest(), 16) % 2 == 0
        if self.down and req.stage == "extract" and lost:
            raise ScriptedFailure("connection reset by peer", transport=True)


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    o = Outage()
    original = scripted.fake_reply

    def reply(req: LLMRequest) -> str:
        o(req)  # records, may fail or request a stop
        return original(req)

    monkeypatch.setattr(scripted, "fake_reply", reply)
    yield o
    preempt.reset()


def _overrides(tmp_path: Path) -> list[str]:
    return ["debug=scripted", f"paths.cache_dir={tmp_path / 'cache'}", "stages=[load,extract]"]


def test_unanswered_requests_make_the_stage_incomplete_and_a_rerun_resends_only_them(
    tmp_path: Path, outage: Outage
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(StageIncompleteError) as err:
        run_pipeline(_overrides(tmp_path), run_dir)
    run = RunDir(run_dir)
    entry = run.stage_entry("extract")
    assert entry is not None and entry["status"] == "incomplete"
    n_lost, n_all = entry["unanswered"], entry["requests"]
    assert 0 < n_lost < n_all
    assert f"stage 'extract' incomplete: {n_lost} of {n_all} requests" in str(err.value)
    assert "connection reset by peer" in str(err.value)
    assert not run.has_table("entries")  # nothing downstream can read a partial table
    logged = run.read_table("requests").filter(pl.col("stage") == "extract")
    assert logged.height == n_all and int(logged["unanswered"].sum()) == n_lost

    # A later stage alone is refused while extract is incomplete.
    with pytest.raises(StageIncompleteError, match=r"\['extract'\].*incomplete"):
        run_pipeline([*_overrides(tmp_path)[:-1], "stages=[embed]"], run_dir)

    outage.down = False
    outage.calls.clear()
    run_pipeline(_overrides(tmp_path), run_dir)  # a plain rerun: same command
    assert run.stage_entry("extract")["status"] == "done"  # type: ignore[index]
    assert len(outage.calls) == n_lost  # only the unanswered requests reached the "server"
    logged = run.read_table("requests").filter(pl.col("stage") == "extract")
    assert logged.height == n_all and logged["request_id"].n_unique() == n_all
    assert int((~logged["cache_hit"]).sum()) == n_lost and not logged["unanswered"].any()
    assert run.has_table("entries")


def test_a_stop_signal_ends_the_stage_without_tables_and_the_rerun_resumes(
    tmp_path: Path, outage: Outage
) -> None:
    outage.down = False
    outage.stop_after = 3  # SIGTERM arrives while extract is running
    run_dir = tmp_path / "run"
    with pytest.raises(Preempted, match="stage 'extract' stopped by SIGTERM"):
        run_pipeline(_overrides(tmp_path), run_dir)
    run = RunDir(run_dir)
    assert not run.has_table("entries") and run.stage_entry("extract") is None
    answered = len(outage.calls)
    preempt.reset()
    outage.stop_after = None
    outage.calls.clear()
    run_pipeline(_overrides(tmp_path), run_dir)
    logged = run.read_table("requests").filter(pl.col("stage") == "extract")
    # The scripted backend answers a whole batch at once, so everything it answered before the
    # stop landed in the cache: the rerun re-sends none of those.
    assert int(logged["cache_hit"].sum()) == answered and len(outage.calls) == logged.height - answered


def test_full_disk_leaves_the_old_table_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tables" / "entries.parquet"
    atomic_write_parquet(path, pl.DataFrame({"a": [1, 2]}))

    def full(self: Any, file: Any, **kw: Any) -> None:
        Path(file).write_bytes(b"PAR1 half a table")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    with pytest.raises(WriteError, match=r"entries\.parquet: could not write \(No space left"):
        atomic_write_parquet(path, pl.DataFrame({"a": [3]}))
    monkeypatch.undo()
    assert pl.read_parquet(path)["a"].to_list() == [1, 2]
    assert [p.name for p in path.parent.iterdir()] == ["entries.parquet"]
