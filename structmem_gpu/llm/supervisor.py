"""A launched server that dies is replaced, and only the requests it left unanswered are re-sent.

    sup = ServerSupervisor(lambda: launch_server(...), name="llm", max_restarts=3)
    backend = SupervisedBackend(HTTPBackend(base_url=sup.start().base_url, ...), sup)
    backend.generate(requests)      # server SIGKILLed mid-batch -> new server, resend the rest

How it fits together: the HTTP client already fails the remaining requests of a batch fast
once the server process it talks to has exited (`HTTPBackend._server_death`), as unanswered
results. `SupervisedBackend` then starts a new server (a fresh port, the same command and log
file), points the client at it and re-sends exactly the unanswered requests; each request keeps
one result, so requests.parquet has no duplicate and loses nothing. Replies that arrived before
the crash were already written to the response cache by the wrapper above this one.

Bounded: after `max_restarts` replacements in one job the remaining requests stay unanswered,
and the pipeline records the stage as incomplete (exit 2; a rerun resumes it). A server that is
still alive while requests go unanswered (timeouts, a wedged engine) is not restarted.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from structmem_gpu.core import preempt
from structmem_gpu.llm.server import RunningServer
from structmem_gpu.llm.structured import OnResult
from structmem_gpu.llm.types import LLMRequest, LLMResult, Requests, noted, streams

log = logging.getLogger(__name__)

Launcher = Callable[[], contextlib.AbstractContextManager[RunningServer]]


class ServerSupervisor:
    """Owns the launched server: start, replace after a crash, stop."""

    def __init__(self, launch: Launcher, *, name: str, max_restarts: int) -> None:
        self._launch = launch
        self.name = name
        self.max_restarts = int(max_restarts)
        self.restarts = 0
        self._cm: contextlib.AbstractContextManager[RunningServer] | None = None
        self.server: RunningServer | None = None

    def start(self) -> RunningServer:
        self._cm = self._launch()
        self.server = self._cm.__enter__()
        return self.server

    def can_restart(self) -> bool:
        return self.restarts < self.max_restarts

    def restart(self) -> RunningServer:
        """Stop what is left of the old server (its process group) and start a new one."""
        self.restarts += 1
        self.close()
        return self.start()

    def close(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)

    def __enter__(self) -> "ServerSupervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SupervisedBackend:
    """An HTTPBackend whose launched server is replaced when it dies during a batch."""

    def __init__(self, inner: Any, supervisor: ServerSupervisor) -> None:
        self.inner = inner
        self.supervisor = supervisor
        self.model_id = inner.model_id

    @property
    def cache_params(self) -> dict[str, Any]:
        return dict(getattr(self.inner, "cache_params", {}))

    @property
    def server(self) -> RunningServer | None:
        return self.supervisor.server

    @property
    def base_url(self) -> str:
        return str(self.inner.base_url)

    def __repr__(self) -> str:
        return f"SupervisedBackend({self.inner!r}, restarts={self.supervisor.restarts})"

    streams = True  # takes an iterator (llm/types.py), as its HTTP backend does

    def generate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        if not isinstance(requests, Sequence) and not streams(self.inner):
            requests = list(requests)
        if not isinstance(requests, Sequence):  # a stream: kept as drawn, for re-sending
            drawn: list[LLMRequest] = []
            results = self.inner.generate(noted(requests, drawn), desc=desc,
                                          on_result=on_result, total=total)
            requests = drawn
        else:
            results = self.inner.generate(requests, desc=desc, on_result=on_result)
        while True:
            pending = [i for i, r in enumerate(results) if r.unanswered]
            srv = self.supervisor.server
            if not pending or preempt.requested() or srv is None or srv.alive():
                return results
            code = srv.process.returncode
            if not self.supervisor.can_restart():
                log.error("%s server died (exit code %s) and %d restarts are used up: %d of %d "
                          "requests of '%s' stay unanswered", self.supervisor.name, code,
                          self.supervisor.max_restarts, len(pending), len(requests), desc)
                return results
            log.warning("%s server died (exit code %s; log %s) during '%s': %d of %d requests "
                        "unanswered; starting replacement %d/%d and re-sending only those",
                        self.supervisor.name, code, srv.log_path, desc, len(pending),
                        len(requests), self.supervisor.restarts + 1, self.supervisor.max_restarts)
            new = self.supervisor.restart()
            self.inner.base_url = new.base_url.rstrip("/")
            self.inner.server = new
            results = self._resend(requests, results, pending, desc, on_result)

    def _resend(self, requests: Sequence[LLMRequest], results: list[LLMResult],
                pending: list[int], desc: str, on_result: OnResult | None) -> list[LLMResult]:
        def relay(j: int, res: LLMResult) -> None:
            if on_result is not None:
                on_result(pending[j], res)

        again = self.inner.generate([requests[i] for i in pending], desc=f"{desc} (resend)",
                                    on_result=relay)
        out = list(results)
        for i, res in zip(pending, again, strict=True):
            out[i] = res
        return out
