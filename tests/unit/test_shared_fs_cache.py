"""The caches on a shared file system without locks: four writer processes posing as four hosts
share one cache directory in which every fcntl/flock lock fails with ENOLCK and SQLite refuses
to open (as GPFS/Lustre/NFS mounts do to WAL's shared memory and locks). One writer is
SIGKILLed mid-write. Afterwards every reply a finished job received is readable, the killed
job lost at most its last unpublished interval, and `cache compact` leaves one reply per key.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.core import segstore
from structmem_gpu.embed.cache import EmbeddingCache
from structmem_gpu.llm.cache import CACHE_FILE, CachedBackend, CacheError, ResponseCache
from structmem_gpu.llm.dedup import cache_key
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling
from tests.fixtures.llm import OneAtATime

PUBLISH_EVERY = 200
N_PER_JOB = 3000


def _req(i: int) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", stage="extract", prompt_version="p/1",
                      messages=(Message("system", "s"), Message("user", f"message number {i}")),
                      sampling=Sampling(max_tokens=32))


def _no_locks_here(host: str) -> None:
    """What a writer on a lock-less shared mount sees: no flock/lockf/fcntl locks, no SQLite
    (WAL needs shared memory and locks), and its own host name."""
    import errno
    import fcntl
    import socket
    import sqlite3

    def enolck(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOLCK, "No locks available")

    real_fcntl = fcntl.fcntl
    lock_cmds = {fcntl.F_SETLK, fcntl.F_SETLKW, fcntl.F_GETLK} | {
        getattr(fcntl, n) for n in ("F_OFD_SETLK", "F_OFD_SETLKW", "F_OFD_GETLK") if hasattr(fcntl, n)}

    def fake_fcntl(fd: Any, cmd: int, *args: Any) -> Any:
        return enolck() if cmd in lock_cmds else real_fcntl(fd, cmd, *args)

    def no_sqlite(*_a: Any, **_k: Any) -> Any:
        raise sqlite3.OperationalError("locking protocol (WAL refused on this file system)")

    fcntl.flock = enolck  # type: ignore[assignment]
    fcntl.lockf = enolck  # type: ignore[assignment]
    fcntl.fcntl = fake_fcntl  # type: ignore[assignment]
    sqlite3.connect = no_sqlite  # type: ignore[assignment]
    socket.gethostname = lambda: host  # type: ignore[assignment]


class _Slow(OneAtATime):
    """One request at a time, 1 ms apart."""

    pause_s = 0.001


def _writer(cache_dir: str, worker: int, out: str) -> None:
    _no_locks_here(f"node{worker}")
    first = worker * N_PER_JOB // 2  # overlapping ranges: neighbours write some equal keys
    reqs = [_req(i) for i in range(first, first + N_PER_JOB)]
    got: dict[str, str] = {}
    progress = open(out + ".progress", "w", encoding="utf-8")  # noqa: SIM115

    def seen(i: int, res: LLMResult) -> None:
        progress.write(res.request_id + "\n")
        progress.flush()

    cache = ResponseCache(Path(cache_dir) / "llm", publish_every=PUBLISH_EVERY, publish_s=600)
    llm = CachedBackend(_Slow(model_id="m"), cache)
    for start in range(0, N_PER_JOB, 500):  # write, then read back what was written so far
        for res in llm.generate(reqs[start : start + 500], on_result=seen):
            got[res.request_id] = res.text
        again = llm.generate(reqs[: start + 500])
        assert all(r.cache_hit and r.text == got[r.request_id] for r in again)
    # Embeddings too: each job writes vectors, some texts shared with its neighbour.
    emb = EmbeddingCache(Path(cache_dir) / "embeddings")
    hashes = [f"h{i}" for i in range(worker * 50, worker * 50 + 100)]
    emb.put_many("ns", hashes, np.tile(np.arange(4, dtype="f4"), (100, 1)) * worker)
    assert set(emb.get_many("ns", hashes)) == set(hashes)
    # Every job also stores the same 100 replies without looking first (as jobs that miss the
    # same keys at the same moment do): duplicates across segments, which compact merges.
    shared = [_req(10**6 + i) for i in range(100)]
    for r, res in zip(shared, ScriptedLLM(model_id="m").generate(shared), strict=True):
        cache.put(cache_key("m", r), r, res)
    cache.close()
    Path(out).write_text(json.dumps(got), encoding="utf-8")


@pytest.mark.e2e  # e2e: four writer processes, one killed
def test_four_hosts_without_locks_one_killed(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"job{w}.json") for w in range(4)]
    procs = [ctx.Process(target=_writer, args=(str(cache_dir), w, outs[w])) for w in range(4)]
    for p in procs:
        p.start()
    victim = procs[3]
    progress = Path(outs[3] + ".progress")
    deadline = time.monotonic() + 300
    while not progress.exists() or len(progress.read_text().split()) < 1100:
        assert victim.is_alive() and time.monotonic() < deadline, "victim ended before the kill"
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)  # mid-write: no finally, no flush
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0, 0, -signal.SIGKILL]

    assert not list(cache_dir.rglob("*.sqlite*"))  # nothing of SQLite was created
    cache = ResponseCache(cache_dir / "llm")
    reader = CachedBackend(ScriptedLLM(model_id="m"), cache)
    for w in range(3):  # finished jobs: every reply they received is there, the same text
        got = json.loads(Path(outs[w]).read_text())
        assert len(got) == N_PER_JOB
        first = w * N_PER_JOB // 2
        out = reader.generate([_req(i) for i in range(first, first + N_PER_JOB)])
        assert all(r.cache_hit and r.text == got[r.request_id] for r in out)
    assert reader.inner.calls == 0  # type: ignore[attr-defined]

    # The killed job: what it received minus what was published is at most its last interval
    # (publish_every replies, plus those that landed while that interval was being written).
    received = set(progress.read_text().split())
    mine = [_req(int(r[1:])) for r in sorted(received)]
    probe = ScriptedLLM(model_id="m")
    hits = CachedBackend(probe, cache).generate(mine)
    lost = sum(not r.cache_hit for r in hits)
    assert len(received) >= 1100 and lost <= 2 * PUBLISH_EVERY, (len(received), lost)
    assert not Path(outs[3]).exists()

    # compact: one record per key; verify re-reads every record.
    from jobs.data import main as data_main

    store = cache_dir / "llm" / CACHE_FILE
    before = segstore.verify(store)
    assert before["duplicates"] >= 200 and not before["damaged"]  # 3 jobs x 100 shared keys
    assert data_main(["cache", "compact", "--cache-dir", str(cache_dir)]) == 0
    after = segstore.verify(store)
    assert after["segments"] == 1 and after["duplicates"] == 0
    assert after["records"] == after["keys"] == before["keys"]
    assert len(ResponseCache(cache_dir / "llm")) == before["keys"]
    emb = segstore.verify(cache_dir / "embeddings" / "embeddings.seg")
    assert emb["keys"] == 200 and emb["duplicates"] == 0  # h0..h199, neighbours overlap
    assert data_main(["cache", "verify", "--cache-dir", str(cache_dir)]) == 0


def test_a_reader_sees_segments_published_after_it_opened(tmp_path: Path) -> None:
    a, b = ResponseCache(tmp_path), ResponseCache(tmp_path)
    CachedBackend(ScriptedLLM(), a).generate([_req(1)])
    inner = ScriptedLLM()
    [res] = CachedBackend(inner, b).generate([_req(1)])
    assert res.cache_hit and inner.calls == 0


def test_compact_while_a_reader_holds_old_segments(tmp_path: Path) -> None:
    a = ResponseCache(tmp_path)
    llm = CachedBackend(ScriptedLLM(), a)
    for i in range(3):
        llm.generate([_req(i)])  # three segments
    reader = ResponseCache(tmp_path)
    assert len(reader) == 3
    segstore.compact(tmp_path / CACHE_FILE, kind="llm-response", fmt="llm-response/1")
    assert len(list((tmp_path / CACHE_FILE / "seg").glob("*.seg"))) == 1
    inner = ScriptedLLM()
    out = CachedBackend(inner, reader).generate([_req(i) for i in range(3)])  # re-lists once
    assert all(r.cache_hit for r in out) and inner.calls == 0


def test_time_interval_publishes_without_a_flush(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path, publish_every=10_000, publish_s=0.2)
    [res] = ScriptedLLM().generate([_req(0)])
    cache.put("k0", _req(0), res)
    other = ResponseCache(tmp_path)
    deadline = time.monotonic() + 10
    while not other.get_many(["k0"]):
        assert time.monotonic() < deadline, "not published within publish_s"
        time.sleep(0.05)
    cache.close()


def test_damaged_segment_is_named_with_the_command_to_move_it(tmp_path: Path) -> None:
    CachedBackend(ScriptedLLM(), ResponseCache(tmp_path)).generate([_req(0)])
    [seg] = (tmp_path / CACHE_FILE / "seg").glob("*.seg")
    seg.write_bytes(seg.read_bytes()[:-5])
    with pytest.raises(CacheError) as err:
        ResponseCache(tmp_path)
    assert f"mv {seg} {seg}.damaged" in str(err.value) and "cache.llm=false" in str(err.value)
    assert segstore.verify(tmp_path / CACHE_FILE)["damaged"]


def test_legacy_sqlite_cache_is_converted_by_compact(tmp_path: Path) -> None:
    import sqlite3

    from jobs.data import main as data_main

    # A cache of the SQLite era: the old table layout, one row.
    llm_dir = tmp_path / "llm"
    llm_dir.mkdir()
    [res] = ScriptedLLM().generate([_req(5)])
    from structmem_gpu.llm.cache import COLUMNS
    from structmem_gpu.llm.dedup import cache_key

    key = cache_key("scripted", _req(5))
    conn = sqlite3.connect(llm_dir / "llm_responses.sqlite")
    conn.execute(f"CREATE TABLE responses ({', '.join(COLUMNS)})")
    conn.execute(f"INSERT INTO responses VALUES ({', '.join('?' * len(COLUMNS))})",
                 (key, "scripted", "p/1", res.messages_hash, "[]", None, "{}", res.text,
                  res.prompt_tokens, res.completion_tokens, None, "stop", 1, 1, 0.1, 0.0))
    conn.commit()
    conn.close()
    assert data_main(["cache", "compact", "--cache-dir", str(tmp_path)]) == 0
    assert (llm_dir / "llm_responses.sqlite.converted").exists()
    inner = ScriptedLLM()
    [hit] = CachedBackend(inner, ResponseCache(llm_dir)).generate([replace(_req(5))])
    assert hit.cache_hit and hit.text == res.text and inner.calls == 0
    assert data_main(["cache", "verify", "--cache-dir", str(tmp_path)]) == 0
