"""LLM-layer faults without a model: a stop signal (no new sends, in-flight replies land), a
launched server that dies mid-batch (replaced, only the unanswered re-sent), refusals vs no
reply, and a damaged or foreign response cache (a clear error, never a traceback)."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.core import preempt
from structmem_gpu.llm.cache import CACHE_FILE, CacheError, CachedBackend, ResponseCache
from structmem_gpu.llm.client import HTTPBackend
from structmem_gpu.llm.server import launch_server
from structmem_gpu.llm.supervisor import ServerSupervisor, SupervisedBackend
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling
from tests.fixtures.llm import FakeServer, completion


def req(i: int) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", stage="extract", prompt_version="t/1",
                      messages=(Message("user", f"say {i}"),), sampling=Sampling(max_tokens=8))


def backend(url: str, **kw: Any) -> HTTPBackend:
    args: dict[str, Any] = dict(base_url=url, served_name="fake", model_id="fake|m|",
                                max_in_flight=2, max_retries=1, retry_backoff_s=0.01,
                                progress=False)
    return HTTPBackend(**{**args, **kw})


@pytest.fixture(autouse=True)
def _no_stop_left_over() -> Any:
    preempt.reset()
    yield
    preempt.reset()


def test_refusal_is_answered_but_a_dead_endpoint_is_unanswered(fake_chat_server: FakeServer) -> None:
    fake_chat_server.behaviour = lambda body, k: (400, b'{"error": "bad schema"}', 0.0)
    [refused] = backend(fake_chat_server.url).generate([req(0)])
    assert refused.finish_reason == "error" and not refused.unanswered
    [lost] = backend("http://127.0.0.1:9/v1").generate([req(1)])  # nothing listens on port 9
    assert lost.unanswered and "gave up after 2 attempts" in (lost.error or "")


def test_stop_signal_sends_nothing_new_and_lets_in_flight_replies_land(
    fake_chat_server: FakeServer,
) -> None:
    started = threading.Event()

    def slow(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        started.set()
        preempt.request_stop("SIGTERM")  # the signal arrives while this request is in flight
        return 200, completion("landed"), 0.3

    fake_chat_server.behaviour = slow
    preempt._state["grace_s"] = 30.0  # what a PreemptionGuard sets from preempt.grace_s
    seen: list[LLMResult] = []
    out = backend(fake_chat_server.url, max_in_flight=1).generate(
        [req(i) for i in range(5)], on_result=lambda i, r: seen.append(r))
    assert out[0].parse_ok and out[0].text == "landed" and not out[0].unanswered
    assert all(r.unanswered and "job stopping (SIGTERM)" in (r.error or "") for r in out[1:])
    assert len(fake_chat_server.bodies) == 1 and len(seen) == 5


def test_in_flight_requests_are_abandoned_after_the_grace_period(
    fake_chat_server: FakeServer,
) -> None:
    def hang(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        preempt.request_stop("SIGUSR2")
        return 200, completion("too late"), 5.0

    preempt._state["grace_s"] = 0.2
    fake_chat_server.behaviour = hang
    [res] = backend(fake_chat_server.url).generate([req(0)])
    assert res.unanswered and "abandoned in flight" in (res.error or "")


def test_a_stream_cut_by_the_grace_period_answers_every_request(
    fake_chat_server: FakeServer,
) -> None:
    """Requests drawn ahead (or never drawn) when the workers are cancelled still get a result,
    so the dedup layer above has one for every request it handed over."""
    from structmem_gpu.llm.dedup import DedupBackend

    def hang(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        preempt.request_stop("SIGUSR2")
        return 200, completion("too late"), 5.0

    preempt._state["grace_s"] = 0.2
    fake_chat_server.behaviour = hang
    out = DedupBackend(backend(fake_chat_server.url, max_in_flight=1)).generate(
        (req(i) for i in range(4)), total=4)
    assert [r.request_id for r in out] == ["r0", "r1", "r2", "r3"]
    assert all(r.unanswered for r in out) and len(fake_chat_server.bodies) == 1
    assert "abandoned in flight" in (out[0].error or "")
    assert all("not sent" in (r.error or "") for r in out[1:])


STANDIN = textwrap.dedent("""
    import json, sys, http.server
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _send(self, body):
            data = json.dumps(body).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(data)))
            self.end_headers(); self.wfile.write(data)
        def do_GET(self): self._send({"data": [{"id": "fake"}]})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            print("POST", body["messages"][-1]["content"], flush=True)
            self._send({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def standin_supervisor(tmp_path: Path, *, max_restarts: int) -> ServerSupervisor:
    """A supervisor launching the stand-in chat server (log: <tmp_path>/standin.server.log)."""
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    return ServerSupervisor(
        lambda: launch_server(lambda port: [sys.executable, str(script), str(port)],
                              ready_path="/v1/models", log_dir=tmp_path, name="standin",
                              startup_timeout_s=30, death_signal=signal.SIGKILL),
        name="standin", max_restarts=max_restarts)


@pytest.mark.parametrize("as_stream", [False, True], ids=["list", "stream"])
def test_dead_server_is_replaced_and_only_unanswered_requests_are_resent(
    tmp_path: Path, as_stream: bool
) -> None:
    sup = standin_supervisor(tmp_path, max_restarts=2)
    with sup:
        first = sup.start()
        http = backend(first.base_url, max_in_flight=1)
        http.server = first
        llm = SupervisedBackend(http, sup)
        done: list[int] = []

        def kill_after_two(i: int, res: LLMResult) -> None:
            done.append(i)
            if len(done) == 2:
                os.killpg(first.pid, signal.SIGKILL)
                first.process.wait(10)

        batch = [req(i) for i in range(6)]
        out = llm.generate(iter(batch) if as_stream else batch, on_result=kill_after_two)
        assert sup.restarts == 1 and sup.server is not None and sup.server.pid != first.pid
        assert [r.request_id for r in out] == [f"r{i}" for i in range(6)]
        assert all(r.parse_ok and not r.unanswered for r in out)
    log = (tmp_path / "standin.server.log").read_text()
    posts = [ln.split()[-1] for ln in log.splitlines() if ln.startswith("POST")]
    assert sorted(posts) == [f"say {i}".split()[-1] for i in range(6)]  # each answered once


def test_restarts_used_up_leave_requests_unanswered(tmp_path: Path) -> None:
    sup = standin_supervisor(tmp_path, max_restarts=0)
    with sup:
        srv = sup.start()
        http = backend(srv.base_url)
        http.server = srv
        os.killpg(srv.pid, signal.SIGKILL)
        srv.process.wait(10)
        out = SupervisedBackend(http, sup).generate([req(0), req(1)])
    assert all(r.unanswered and "standin server exited" in (r.error or "") for r in out)


def _cache_with_one_row(tmp_path: Path) -> Path:
    """The one published segment of a cache holding one reply."""
    cache = ResponseCache(tmp_path)
    from structmem_gpu.llm.scripted import ScriptedLLM

    CachedBackend(ScriptedLLM(), cache).generate([req(0)])
    cache.close()
    [seg] = (tmp_path / CACHE_FILE / "seg").glob("*.seg")
    return seg


def test_garbage_cache_segment_is_named_with_the_command_to_move_it(tmp_path: Path) -> None:
    path = _cache_with_one_row(tmp_path)
    path.write_bytes(b"this is not a cache segment at all" * 100)
    with pytest.raises(CacheError) as err:
        ResponseCache(tmp_path)
    msg = str(err.value)
    assert str(path) in msg and f"mv {path} {path}.damaged" in msg and "cache.llm=false" in msg


def test_truncated_cache_segment_is_named(tmp_path: Path) -> None:
    path = _cache_with_one_row(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(CacheError, match="response cache unreadable"):
        c = ResponseCache(tmp_path)
        c.get_many(["x"])


def test_cache_of_another_key_format_is_refused(tmp_path: Path) -> None:
    from structmem_gpu.core import segstore

    segstore.write_segment(tmp_path / CACHE_FILE, "old", [("k", b"{}", None)],
                           {"kind": "llm-response", "format": "llm-response/0"})
    with pytest.raises(CacheError, match=r"key format 'llm-response/0'.*mv "):
        ResponseCache(tmp_path)


def test_unreachable_endpoint_fails_the_rest_of_the_batch_fast() -> None:
    """An attached server that went away: one request pays the retries, the others are not
    sent (they would each wait through the same backoff) and come back unanswered at once."""
    from structmem_gpu.llm.server import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    out = backend(url, max_in_flight=1, max_retries=2).generate([req(i) for i in range(6)])
    assert all(r.unanswered for r in out)
    assert out[0].attempts == 3 and "gave up after 3 attempts" in (out[0].error or "")
    assert all(r.attempts == 0 and f"not sent: {url} unreachable" in (r.error or "")
               for r in out[1:])


def test_guard_catches_the_signal_and_chains_to_the_previous_handler() -> None:
    """SIGUSR2 (submitit's time-limit signal) sets the stop flag instead of killing the job;
    afterwards the handler installed before ours (submitit's requeue) is called."""
    called: list[int] = []
    old = signal.signal(signal.SIGUSR2, lambda signum, frame: called.append(signum))
    try:
        guard = preempt.PreemptionGuard(grace_s=1, exit_code=75)
        with guard:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert preempt.requested() and preempt.signal_name() == "SIGUSR2"
            assert called == []  # ours ran, not the old one
            with pytest.raises(preempt.Preempted, match="stage 'extract' stopped by SIGUSR2"):
                preempt.check("extract")
        guard.chain()
        assert called == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR2) != guard._handle  # restored
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_the_http_client_under_a_supervised_backend_is_the_innermost():
    """A system's front forwards to the client's served name and flavour: a job that launched its
    own server wraps the client in a SupervisedBackend, which has a base_url but no served_name
    (method=lightmem_official with llm=llamacpp_cpu failed on that before)."""
    from types import SimpleNamespace

    from structmem_gpu.stage import http_backend_of

    http = SimpleNamespace(base_url="http://127.0.0.1:9/v1", served_name="smol", model_id="m",
                           flavor="llamacpp")
    wrapped = SimpleNamespace(inner=SupervisedBackend(http, object()))
    assert http_backend_of(wrapped) is http
    assert http_backend_of(SimpleNamespace(inner=None)) is None
