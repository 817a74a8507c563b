"""Preemption: SIGTERM / SIGUSR2 stop a job cleanly so that its requeued copy resumes.

    with PreemptionGuard(grace_s=20):          # jobs/run.py, around the whole job (preempt.grace_s)
        run_stages(...)                        # raises Preempted once a signal arrived

What a signal does (docs/failure-behaviour.md "Failure behaviour"):

1. The LLM client sends no new request (each unsent one comes back as "not sent: preempted",
   i.e. unanswered) and lets the requests already in flight land, for at most `grace_s`
   seconds; every reply that lands is written to the response cache as usual.
2. The running stage writes no table and no manifest entry (`Preempted` is raised before).
3. The job stops its servers and exits with `exit_code` (default 75, EX_TEMPFAIL: "try again").
   Under submitit, the signal handler submitit installed is called afterwards, so its
   checkpoint-and-requeue still happens; a plain sbatch script can requeue on exit code 75.

4. Where the job waits on something that sends nothing (a model load, a server's start-up and
   readiness wait, the preflight), the phase is `interruptible`: the signal raises at once,
   so the job stops within the grace whatever it is doing (a launched server is stopped on
   the way out by its `with` block).

SLURM sends SIGTERM on preemption and, with `--signal=USR2@90` (submitit's default), SIGUSR2
before the time limit. Handlers can only be installed from the main thread; elsewhere (a test
runner thread) the guard is inert and says so at DEBUG level.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from structmem_gpu.core.errors import StructMemError

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
DEFAULT_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): temporary failure, the caller may retry

# grace_s is set by PreemptionGuard from preempt.grace_s (its one home: config/schema.py
# PreemptSettings); a stop requested outside a guard lets nothing in flight land.
_state: dict[str, Any] = {"signal": None, "at": None, "grace_s": 0.0}
_event = threading.Event()
_phases: list[str] = []  # interruptible phases the main thread is in, innermost last


class Preempted(StructMemError):
    """A stop signal arrived; the job ends without writing the running stage's tables."""

    def __init__(self, message: str, signame: str | None) -> None:
        super().__init__(message)
        self.signame = signame


def requested() -> bool:
    """True once a stop signal arrived (the client sends nothing new after that)."""
    return _event.is_set()


def signal_name() -> str | None:
    return _state["signal"]


def grace_deadline() -> float | None:
    """Monotonic time after which in-flight requests are abandoned (None: no stop yet)."""
    at = _state["at"]
    return None if at is None else at + float(_state["grace_s"])


def request_stop(signame: str = "SIGTERM") -> None:
    """What the signal handler does; also callable directly (tests, an operator's hook)."""
    if not _event.is_set():
        _state.update(signal=signame, at=time.monotonic())
        _event.set()
        log.warning("%s received: sending no new LLM request; in-flight replies have %.0f s to "
                    "land in the cache, then the job stops for requeue", signame, _state["grace_s"])


def reset() -> None:
    """Forget a stop request (tests; a new job in the same process)."""
    _event.clear()
    _state.update(signal=None, at=None)


def check(stage: str) -> None:
    """Raise Preempted when a stop was requested (called before a stage writes anything)."""
    if requested():
        raise Preempted(
            f"stage '{stage}' stopped by {signal_name()}: no table written; rerun (or let the "
            f"scheduler requeue) the same command to resume, only unanswered requests are re-sent",
            signal_name(),
        )


class _Interrupt(BaseException):
    """Raised by the signal handler inside an interruptible phase. A BaseException, so that
    a library's `except Exception` (retry loops, fallbacks while loading) cannot swallow it;
    `interruptible` turns it into Preempted."""


def _stopped(phase: str) -> Preempted:
    return Preempted(
        f"{phase} stopped by {signal_name()}: no table written; rerun (or let the scheduler "
        f"requeue) the same command to resume", signal_name())


@contextlib.contextmanager
def interruptible(phase: str) -> Iterator[None]:
    """A phase with no request in flight (model load, server start-up, readiness wait): a stop
    signal raises Preempted at once instead of waiting for the phase to end. Entering it
    after a stop was requested raises too."""
    if requested():
        raise _stopped(phase)
    if threading.current_thread() is not threading.main_thread():
        yield  # the handler runs in the main thread: it cannot interrupt this one (it polls)
        return
    _phases.append(phase)
    try:
        yield
    except _Interrupt:
        raise _stopped(phase) from None
    finally:
        _phases.pop()


def check_phase(phase: str) -> None:
    """Raise Preempted when a stop was requested (polling loops of an interruptible phase)."""
    if requested():
        raise _stopped(phase)


Handler = Callable[[int, FrameType | None], Any] | int | None


class PreemptionGuard:
    """Install the stop handlers for the block; restore (and remember) the previous ones."""

    def __init__(self, grace_s: float, exit_code: int = DEFAULT_EXIT_CODE) -> None:
        # grace_s has no default here: its one home is config/schema.py PreemptSettings.
        self.grace_s = float(grace_s)
        self.exit_code = int(exit_code)
        self.previous: dict[int, Handler] = {}
        self.installed = False

    def __enter__(self) -> "PreemptionGuard":
        reset()
        _state["grace_s"] = self.grace_s
        if threading.current_thread() is not threading.main_thread():
            log.debug("not the main thread: preemption signals keep their default handlers")
            return self
        for sig in SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        request_stop(signal.Signals(signum).name)
        if _phases:  # nothing in flight to let land: stop the load / start-up / wait now
            raise _Interrupt()

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            for sig, old in self.previous.items():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            self.installed = False

    def chain(self) -> None:
        """Call the handler that was installed before ours for the signal that stopped us
        (submitit's checkpoint-and-requeue); it may exit the process itself."""
        name = signal_name()
        if name is None:
            return
        sig = signal.Signals[name]
        old = self.previous.get(sig)
        if callable(old):
            log.info("passing %s on to the previously installed handler (%r)", name, old)
            old(int(sig), None)
