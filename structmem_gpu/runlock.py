"""One job per run directory: an exclusive lock held for the whole job.

    with hold_run_dir(Path("outputs/runs/sample/structmem")):
        run_stages(...)                       # a second job on the same directory exits 2

The lock is an OS file lock (`filelock`, flock on Linux) on `<run_dir>/.run.lock`; the kernel
drops it when the holder dies, even by SIGKILL, so a crashed job never blocks the next one.
Beside it, `.run.lock.json` names the holder (host, pid, start time) so that a refused job can
say who holds the directory, and so that a job taking over from a dead holder can say so.

On a file system without working flock (some network mounts answer ENOLCK), the holder file
alone is the lock: it is taken over only when its pid is gone on this same host.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from structmem_gpu.errors import StructMemError

log = logging.getLogger(__name__)

LOCK_NAME = ".run.lock"
HOLDER_NAME = ".run.lock.json"


class RunDirBusyError(StructMemError):
    """Another job holds this run directory."""


def _holder_info() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
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
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}{job}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _holder_alive_here(holder: dict[str, Any] | None) -> bool:
    """True when the holder file names a live process on this host (not us)."""
    if not holder or holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    return isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)


def _busy(run_dir: Path, holder: dict[str, Any] | None) -> RunDirBusyError:
    return RunDirBusyError(
        f"{run_dir}: run directory in use by another job ({_describe(holder)}); wait for it to "
        f"finish, stop it, or pass another hydra.run.dir"
    )


def _write_holder(path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(_holder_info()), encoding="utf-8")
    os.replace(tmp, path)


def _note_previous(run_dir: Path, previous: dict[str, Any] | None) -> None:
    """The lock was free: a holder file still there was left by a job that died."""
    if previous and previous.get("pid") != os.getpid():
        log.warning("%s: taking over the run directory lock left by a job that is gone (%s)",
                    run_dir, _describe(previous))


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
    lock = FileLock(str(run_dir / LOCK_NAME), timeout=0)
    soft = False
    try:
        lock.acquire()
    except Timeout:
        raise _busy(run_dir, _read_holder(holder_path)) from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        soft = True  # no flock here: the holder file is the lock (same-host pid check)
        log.warning("%s: file system has no working flock (%s); using the holder file alone",
                    run_dir, e.strerror)
    try:
        previous = _read_holder(holder_path)
        if soft and _holder_alive_here(previous):
            raise _busy(run_dir, previous)
        _note_previous(run_dir, previous)
        _write_holder(holder_path)
        yield
    finally:
        if (_read_holder(holder_path) or {}).get("pid") == os.getpid():
            holder_path.unlink(missing_ok=True)  # ours: a clean exit leaves no holder file
        if not soft:
            lock.release()
