"""One job per run directory: a holder file taken by exclusive create, kept alive by a heartbeat.

    with hold_run_dir(Path("outputs/runs/sample/structmem")):
        run_stages(...)                       # a second job on the same directory exits 2

`<run_dir>/.run.lock.json` is created with O_CREAT|O_EXCL (atomic on local disks and on NFS v3+,
Lustre and GPFS; no flock or POSIX lock, which network mounts may refuse with ENOLCK or
silently not share between hosts). It names the holder (host, pid, start time, SLURM job, a
random token) and carries a heartbeat the holder rewrites every HEARTBEAT_S seconds. Another
job finding the file refuses with one line naming the holder, unless the holder is gone:

  * same host, pid dead: taken over at once (a SIGKILLed job does not block its rerun);
  * any host, heartbeat older than STALE_S: taken over (a job on a dead node, or killed on
    another node). Hosts compare the heartbeat with their own clock: clocks must agree within
    STALE_S - HEARTBEAT_S (NTP keeps cluster nodes within milliseconds).

A takeover renames the stale file aside (only one taker's rename succeeds), checks that what it
renamed is the holder it judged stale (else it puts it back and refuses), then creates its own
holder by exclusive create. A clean exit removes the holder file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import StructMemError

log = logging.getLogger(__name__)

HOLDER_NAME = ".run.lock.json"
HEARTBEAT_S = 10.0  # how often a holder rewrites its heartbeat
STALE_S = 90.0  # heartbeat age after which any host may take the directory over; shorter frees
#                 a dead node's directory sooner, but a holder stalled this long (an NFS hang)
#                 would be taken over while alive


class RunDirBusyError(StructMemError):
    """Another job holds this run directory."""


def _holder_info(token: str) -> dict[str, Any]:
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "token": token,
        "heartbeat": now,
    }


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "holder unknown"
    job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    beat = holder.get("heartbeat")
    age = f", heartbeat {time.time() - beat:.0f}s ago" if isinstance(beat, int | float) else ""
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}{job}{age}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _stale(holder: dict[str, Any] | None, mtime: float | None) -> bool:
    """True when the holder is gone: dead pid on this host, or a heartbeat older than STALE_S.
    An unreadable holder file (being written, or damaged) is judged by its mtime."""
    now = time.time()
    if not holder:
        return mtime is not None and now - mtime > STALE_S
    beat = holder.get("heartbeat")
    if holder.get("host") == socket.gethostname():
        pid = holder.get("pid")
        if isinstance(pid, int) and pid != os.getpid():
            if not pid_alive(pid):
                return True
            if not isinstance(beat, int | float):
                return False  # a live holder of a version without heartbeats
    if not isinstance(beat, int | float):  # written before heartbeats existed
        beat = mtime if mtime is not None else now
    return now - float(beat) > STALE_S


def _busy(run_dir: Path, holder: dict[str, Any] | None) -> RunDirBusyError:
    return RunDirBusyError(
        f"{run_dir}: run directory in use by another job ({_describe(holder)}); wait for it to "
        f"finish, stop it, or pass another hydra.run.dir"
    )


def _create(path: Path, info: dict[str, Any]) -> bool:
    """Exclusive create of the holder file; False when it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(info))
        f.flush()
        os.fsync(f.fileno())
    return True


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


def _acquire(run_dir: Path, holder_path: Path, info: dict[str, Any]) -> None:
    for _ in range(20):
        if _create(holder_path, info):
            return
        previous = _read_holder(holder_path)
        mtime = _mtime(holder_path)
        if mtime is None:
            continue  # released between our create and our read: try again
        if previous is None and not _stale(None, mtime):
            time.sleep(0.05)  # created a moment ago, contents not written yet
            previous = _read_holder(holder_path)
            if previous is None:
                raise _busy(run_dir, None)
        if not _stale(previous, mtime):
            raise _busy(run_dir, previous)
        aside = holder_path.with_name(f"{HOLDER_NAME}.stale-{info['token']}")
        try:
            os.rename(holder_path, aside)  # one taker wins; the others find no file
        except FileNotFoundError:
            continue
        moved = _read_holder(aside)
        if (moved or {}).get("token") != (previous or {}).get("token"):
            # Someone took over between our read and our rename: put their holder back.
            with contextlib.suppress(FileExistsError):
                os.link(aside, holder_path)
            aside.unlink(missing_ok=True)
            raise _busy(run_dir, moved)
        aside.unlink(missing_ok=True)
        if previous:
            log.warning("%s: taking over the run directory lock left by a job that is gone (%s)",
                        run_dir, _describe(previous))
    raise _busy(run_dir, _read_holder(holder_path))


class _Heartbeat(threading.Thread):
    """Rewrites the holder's heartbeat while the block runs (atomic replace of the file; only
    while the file still carries our token, so a holder that was taken over stops)."""

    def __init__(self, path: Path, info: dict[str, Any]) -> None:
        super().__init__(name="run-dir-heartbeat", daemon=True)
        self.path, self.info = path, info
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            current = _read_holder(self.path)
            if (current or {}).get("token") != self.info["token"]:
                log.error("%s: the run directory lock was taken over by another job (%s)",
                          self.path.parent, _describe(current))
                return
            self.info["heartbeat"] = time.time()
            tmp = self.path.with_name(f"{HOLDER_NAME}.beat-{self.info['token']}")
            try:
                tmp.write_text(json.dumps(self.info), encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as e:  # a transient network file system error: try next beat
                log.warning("%s: heartbeat not written (%s)", self.path, e)


_HELD: dict[str, int] = {}  # run dirs this process holds -> nesting depth (re-entrant)


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold `run_dir` exclusively for the block; raise RunDirBusyError when another job does.
    Re-entrant within one process (a merge that regenerates its report holds it twice)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    key = str(run_dir.resolve())
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    with _hold(run_dir):
        _HELD[key] = 1
        try:
            yield
        finally:
            _HELD.pop(key, None)


@contextlib.contextmanager
def _hold(run_dir: Path) -> Iterator[None]:
    holder_path = run_dir / HOLDER_NAME
    info = _holder_info(secrets.token_hex(8))
    _acquire(run_dir, holder_path, info)
    beat = _Heartbeat(holder_path, info)
    beat.start()
    try:
        yield
    finally:
        beat.stop.set()
        beat.join()
        if (_read_holder(holder_path) or {}).get("token") == info["token"]:
            holder_path.unlink(missing_ok=True)  # ours: a clean exit leaves no holder file
