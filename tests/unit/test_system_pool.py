"""The worker pool of a baseline system (structmem_gpu/systems/pool.py), with a stand-in worker
written here (plain Python, the protocol only): units run in parallel workers, a worker that
dies or hangs turns its unit into an error with the log's tail and is replaced, the others go
on."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from structmem_gpu.systems.pool import WorkerPool
from structmem_gpu.systems.spec import SystemSpec

WORKER = textwrap.dedent('''
    import json, os, sys, time
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "hello":
            reply = {"op": "ready", "system": "fake", "version": "0"}
        elif op == "exit":
            break
        elif msg["unit"] == "crash":
            print("about to crash", file=sys.stderr, flush=True)
            os._exit(3)
        elif msg["unit"] == "hang":
            time.sleep(60)
        else:
            time.sleep(0.3)
            reply = {"op": "built", "unit": msg["unit"], "pid": os.getpid(),
                     "memories": [{"memory_id": "m", "text": msg["unit"]}]}
        out.write(json.dumps(reply) + "\\n")
        out.flush()
''')


def _spec(tmp_path: Path) -> SystemSpec:
    script = tmp_path / "fake_worker.py"
    script.write_text(WORKER)
    return SystemSpec(name="fake", title="Fake", requirements=(), worker=str(script),
                      source="test")


def test_units_run_in_parallel_workers(tmp_path):
    spec = _spec(tmp_path)
    units = [{"op": "build", "unit": f"c{i}"} for i in range(4)]
    t0 = time.monotonic()
    with WorkerPool(spec, Path(sys.executable), n=4, env={}, log_dir=tmp_path / "logs",
                    hello={"op": "hello"}, unit_timeout_s=30) as pool:
        got = dict(pool.run(units))
    assert sorted(got) == ["c0", "c1", "c2", "c3"]
    assert all(r["op"] == "built" for r in got.values())
    assert len({r["pid"] for r in got.values()}) == 4  # four processes, one unit each
    assert time.monotonic() - t0 < 0.3 * 4 + 5  # not one after another (plus start-up)


@pytest.mark.e2e  # e2e: worker processes that crash and hang
def test_a_crash_and_a_hang_are_errors_and_the_rest_goes_on(tmp_path):
    spec = _spec(tmp_path)
    units = [{"op": "build", "unit": u} for u in ("crash", "a", "hang", "b")]
    with WorkerPool(spec, Path(sys.executable), n=1, env={}, log_dir=tmp_path / "logs",
                    hello={"op": "hello"}, unit_timeout_s=3) as pool:
        got = dict(pool.run(units))
        restarts = pool.restarts
    assert got["a"]["op"] == got["b"]["op"] == "built"
    assert got["crash"]["op"] == "error" and "exited with code 3" in got["crash"]["error"]
    assert "about to crash" in got["crash"]["log_tail"]
    assert got["hang"]["op"] == "error" and "no reply within 3 s" in got["hang"]["error"]
    assert restarts == 2


def test_after_a_stop_signal_no_new_unit_starts(tmp_path):
    from structmem_gpu.core import preempt

    spec = _spec(tmp_path)
    preempt.request_stop("SIGTERM")
    try:
        with WorkerPool(spec, Path(sys.executable), n=2, env={}, log_dir=tmp_path / "logs",
                        hello={"op": "hello"}, unit_timeout_s=30) as pool:
            got = dict(pool.run([{"op": "build", "unit": "c0"}, {"op": "build", "unit": "c1"}]))
    finally:
        preempt.reset()
    assert got == {}  # nothing handed out; the stage raises Preempted after the pool
