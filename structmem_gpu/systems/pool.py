"""Worker processes of one baseline system: N in parallel so the server sees a batch.

    with WorkerPool(spec, python, n=4, env=env, log_dir=run.logs_dir, hello=hello) as pool:
        for unit, reply in pool.run(requests):     # requests: protocol build/search dicts
            ...                                    # reply: "built"/"found" or "error" dict

Each worker is `<env>/bin/python systems/workers/<worker>` speaking systems/protocol.py on its
stdin/stdout, its stderr in `logs/system_<name>_<i>.log`. A unit is handed to the next idle
worker; a worker that dies (EOF, crash, segfault: graphiti's Kùzu driver has done so) turns
its unit into an "error" reply with the log's tail and is restarted for the next unit. A unit
that exceeds `unit_timeout_s` kills its worker the same way. After a stop signal
(core/preempt.py) no new unit is handed out; units in flight finish.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.core import preempt
from structmem_gpu.llm.server import _preexec, log_tail
from structmem_gpu.systems.spec import SystemSpec

log = logging.getLogger(__name__)


class WorkerDied(Exception):
    pass


class Worker:
    def __init__(self, spec: SystemSpec, python: Path, env: Mapping[str, str], log_path: Path,
                 hello: Mapping[str, Any], ready_timeout_s: float) -> None:
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [str(python), str(spec.worker_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=dict(env), cwd=str(log_path.parent),
            preexec_fn=_preexec(os.getpid(), signal.SIGTERM),  # dies with the job
        )
        reply = self.call(dict(hello), ready_timeout_s)
        if reply.get("op") != "ready":
            raise WorkerDied(f"worker did not start: {reply.get('error')}\n{reply.get('log_tail', '')}")
        self.version = str(reply.get("version", ""))

    def call(self, msg: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(f"worker gone before the request ({e})") from e
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerDied(f"no reply within {timeout_s:.0f} s (system.unit_timeout_s); "
                                 "worker killed")
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if ready:
                line = fd.readline()
                if not line:
                    code = self.proc.wait(timeout=30)
                    raise WorkerDied(f"worker exited with code {code}")
                return json.loads(line)

    def tail(self) -> str:
        self._log.flush()
        return log_tail(self.log_path, 40)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"op": "exit"}, 10)
            except (WorkerDied, ValueError):
                pass  # already gone: nothing to close
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class WorkerPool:
    def __init__(self, spec: SystemSpec, python: Path, *, n: int, env: Mapping[str, str],
                 log_dir: Path, hello: Mapping[str, Any], unit_timeout_s: float,
                 ready_timeout_s: float = 300.0) -> None:
        self.spec, self.python, self.n = spec, python, max(1, n)
        self.env, self.log_dir, self.hello = env, log_dir, hello
        self.unit_timeout_s, self.ready_timeout_s = unit_timeout_s, ready_timeout_s
        self.version = ""
        self.restarts = 0

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _start(self, slot: int) -> Worker:
        w = Worker(self.spec, self.python, {**self.env, "STRUCTMEM_WORKER_SLOT": str(slot)},
                   self.log_dir / f"system_{self.spec.name}_{slot}.log", self.hello,
                   self.ready_timeout_s)
        self.version = w.version
        return w

    def run(self, requests: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(unit, reply) as units finish (any order). Stops handing out units after a stop
        signal; the caller checks preempt afterwards."""
        todo: queue.Queue[Mapping[str, Any]] = queue.Queue()
        for r in requests:
            todo.put(r)
        done: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()

        def slot_loop(slot: int) -> None:
            worker: Worker | None = None
            try:
                while not preempt.requested():
                    try:
                        req = todo.get_nowait()
                    except queue.Empty:
                        break
                    unit = str(req["unit"])
                    try:
                        if worker is None:
                            worker = self._start(slot)
                        reply = worker.call(req, self.unit_timeout_s)
                    except WorkerDied as e:
                        tail = worker.tail() if worker is not None else ""
                        if worker is not None:
                            worker.kill()
                            worker.close()
                            self.restarts += 1
                        worker = None
                        reply = {"op": "error", "unit": unit, "error": f"WorkerDied: {e}",
                                 "log_tail": tail}
                    done.put((unit, reply))
            finally:
                if worker is not None:
                    worker.close()
                done.put(None)

        threads = [threading.Thread(target=slot_loop, args=(i,), name=f"system-{i}", daemon=True)
                   for i in range(min(self.n, max(1, len(requests))))]
        for t in threads:
            t.start()
        running = len(threads)
        while running:
            item = done.get()
            if item is None:
                running -= 1
                continue
            yield item
        for t in threads:
            t.join()
