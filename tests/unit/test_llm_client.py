"""HTTP client against a misbehaving loopback server written here (no model needed)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.llm.client import HTTPBackend, parse_completion, request_body
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from tests.fixtures.llm import FakeServer, completion, echo_ok

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture
def fake(fake_chat_server: FakeServer) -> FakeServer:
    return fake_chat_server


def backend(fake: FakeServer, **kw: Any) -> HTTPBackend:
    opts: dict[str, Any] = {
        "max_in_flight": 4,
        "request_timeout_s": 5,
        "max_retries": 3,
        "retry_backoff_s": 0.01,
        "progress": False,
    }
    opts.update(kw)
    return HTTPBackend(
        base_url=fake.url, served_name="fake", model_id="fake|m|", flavor="vllm", **opts
    )


def reqs(n: int, schema: dict | None = SCHEMA, max_tokens: int = 8) -> list[LLMRequest]:
    return [
        LLMRequest(
            request_id=f"r{i}",
            stage="test",
            prompt_version="t/1",
            messages=(Message("user", str(i)),),
            schema=schema,
            sampling=Sampling(max_tokens=max_tokens),
        )
        for i in range(n)
    ]


# --- request bodies -------------------------------------------------------------------------


def test_body_vllm_uses_json_schema_and_max_completion_tokens() -> None:
    [r] = reqs(1)
    body = request_body(r, served_name="qwen", flavor="vllm")
    assert body["model"] == "qwen" and body["stream"] is False
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["max_completion_tokens"] == 8 and "max_tokens" not in body
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.0, 1.0, 0)


def test_body_leaves_the_seed_out_when_the_profile_says_so() -> None:
    """llm.request_seed=false (vllm_cpu: its engine dies on a seeded sampled request)."""
    from omegaconf import OmegaConf

    from structmem_gpu.llm.factory import _http_backend, resolve_config

    [r] = reqs(1)
    assert "seed" not in request_body(r, served_name="m", flavor="vllm", request_seed=False)
    vcpu = OmegaConf.load(ROOT / "conf" / "llm" / "vllm_cpu.yaml")
    assert vcpu.request_seed is False
    be = _http_backend(resolve_config({"backend": "vllm_server", "model": "m",
                                       "request_seed": False}), "http://127.0.0.1:1/v1")
    assert be.request_seed is False


def test_body_llamacpp_uses_json_object_schema() -> None:
    [r] = reqs(1)
    body = request_body(r, served_name="smollm2", flavor="llamacpp")
    assert body["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert body["max_tokens"] == 8


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_no_guided_fields_anywhere(flavor: str) -> None:
    # vLLM 0.33 silently ignores guided_* (HTTP 200, unconstrained output).
    for r in [*reqs(1), *reqs(1, schema=None)]:
        body = request_body(r, served_name="m", flavor=flavor, extra_body={"x": 1})
        assert "guided" not in json.dumps(body)


def test_free_text_body_has_no_response_format() -> None:
    [r] = reqs(1, schema=None)
    assert "response_format" not in request_body(r, served_name="m", flavor="vllm")


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_payload_is_the_body_as_json(flavor: str) -> None:
    """What is POSTed (the messages spliced in from their memoised canonical JSON, the
    response format's JSON memoised) decodes to request_body's value exactly."""
    from dataclasses import replace

    from structmem_gpu.llm.client import request_payload
    from structmem_gpu.llm.types import Message

    odd = Message("user", 'Grüße, "quoted" \\ back\nslash \u2028 and ✓')
    cases = [*reqs(2), *reqs(1, schema=None), replace(reqs(1)[0], messages=(odd,))]
    for r in cases:
        for extra in (None, {"x": 1, "messages": ["not ours"], "temperature": 9.0},
                      {"response_format": {"type": "json_object"}}):
            for seed in (True, False):
                kw = dict(served_name="m", flavor=flavor, extra_body=extra, request_seed=seed)
                payload = request_payload(r, **kw)
                assert isinstance(payload, bytes)
                assert json.loads(payload) == request_body(r, **kw)


def test_extra_body_never_overrides_request_fields() -> None:
    [r] = reqs(1)
    body = request_body(
        r,
        served_name="m",
        flavor="vllm",
        extra_body={"temperature": 1.5, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert body["temperature"] == 0.0
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_parse_completion_reads_cached_tokens() -> None:
    text, finish, p, c, cached = parse_completion(json.loads(completion("hi", cached=4)))
    assert (text, finish, p, c, cached) == ("hi", "stop", 7, 3, 4)
    assert parse_completion(json.loads(completion("hi")))[4] is None


# --- client behaviour -----------------------------------------------------------------------


def test_order_preserved_under_concurrency(fake: FakeServer) -> None:
    def jittery(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        n = int(body["messages"][-1]["content"])
        return 200, completion(json.dumps({"n": n})), 0.002 * ((n * 7) % 5)

    fake.behaviour = jittery
    out = backend(fake, max_in_flight=8).generate(reqs(40))
    assert [r.request_id for r in out] == [f"r{i}" for i in range(40)]
    assert [r.data for r in out] == [{"n": i} for i in range(40)]
    assert all(r.parse_ok and r.attempts == 1 and r.prompt_tokens == 7 for r in out)


def test_max_in_flight_is_respected(fake: FakeServer) -> None:
    live = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def counting(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        with lock:
            live["now"] += 1
            live["peak"] = max(live["peak"], live["now"])
        time.sleep(0.02)
        with lock:
            live["now"] -= 1
        return echo_ok(body, k)

    fake.behaviour = counting
    backend(fake, max_in_flight=3).generate(reqs(12))
    assert live["peak"] <= 3


def test_5xx_then_success_is_retried(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (503, b'{"error": "busy"}', 0.0) if k < 2 else echo_ok(b, k)
    be = backend(fake)
    [res] = be.generate(reqs(1))
    assert res.parse_ok and res.data == {"n": 0}
    assert res.attempts == 3 and be.calls == 3


def test_persistent_5xx_becomes_error_result(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (500, b"internal", 0.0)
    out = backend(fake, max_retries=2).generate(reqs(3))
    assert [r.request_id for r in out] == ["r0", "r1", "r2"]
    for r in out:
        assert (r.parse_ok, r.finish_reason, r.attempts, r.data) == (False, "error", 3, None)
        assert "HTTP 500" in (r.error or "") and "gave up after 3" in (r.error or "")


def test_4xx_is_not_retried(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (400, b'{"error": "prompt too long"}', 0.0)
    be = backend(fake)
    [res] = be.generate(reqs(1))
    assert (res.parse_ok, res.finish_reason, res.attempts, be.calls) == (False, "error", 1, 1)
    assert "HTTP 400" in (res.error or "")


def test_slow_reply_times_out_then_retry_succeeds(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (200, completion('{"n": 0}'), 2.0 if k == 0 else 0.0)
    t = time.monotonic()
    [res] = backend(fake, request_timeout_s=0.3).generate(reqs(1))
    assert res.parse_ok and res.attempts == 2
    assert time.monotonic() - t < 1.9  # did not wait for the slow reply


def test_slow_replies_exhaust_retries(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (200, completion('{"n": 0}'), 1.0)
    [res] = backend(fake, request_timeout_s=0.2, max_retries=1).generate(reqs(1))
    assert (res.parse_ok, res.finish_reason, res.attempts) == (False, "error", 2)
    assert "timed out" in (res.error or "")


def test_malformed_response_body_is_retried(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (200, b"<html>proxy error", 0.0) if k == 0 else echo_ok(b, k)
    [res] = backend(fake).generate(reqs(1))
    assert res.parse_ok and res.attempts == 2


def test_connection_refused_becomes_error_result() -> None:
    from structmem_gpu.llm.server import free_port

    be = HTTPBackend(
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        served_name="m",
        model_id="m",
        max_retries=1,
        retry_backoff_s=0.01,
        progress=False,
    )
    [res] = be.generate(reqs(1))
    assert (res.parse_ok, res.finish_reason, res.attempts) == (False, "error", 2)
    assert "Connect" in (res.error or "")


def test_invalid_model_json_is_repaired_once(fake: FakeServer) -> None:
    # The model answers garbage first; after the repair message it answers properly.
    def garbage_then_ok(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
        msgs = body["messages"]
        if len(msgs) == 1:
            return 200, completion('{"n": "not a number"}'), 0.0
        assert msgs[-2]["role"] == "assistant" and "schema violation" in msgs[-1]["content"]
        return 200, completion(json.dumps({"n": int(msgs[0]["content"])})), 0.0

    fake.behaviour = garbage_then_ok
    out = backend(fake).generate(reqs(3))
    assert all(r.parse_ok and r.attempts == 2 for r in out)
    assert [r.data for r in out] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(r.prompt_tokens == 14 for r in out)  # both attempts are accounted


def test_truncated_reply_fails_after_repair(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (200, completion('{"n": 12', finish="length"), 0.0)
    [res] = backend(fake).generate(reqs(1))
    assert (res.parse_ok, res.attempts, res.finish_reason) == (False, 2, "length")
    assert "cut off" in (res.error or "") and res.text == '{"n": 12'


def test_free_text_request(fake: FakeServer) -> None:
    fake.behaviour = lambda b, k: (200, completion("hello there"), 0.0)
    [res] = backend(fake).generate(reqs(1, schema=None))
    assert res.parse_ok and res.text == "hello there" and res.data is None


def test_on_result_called_once_per_request(fake: FakeServer) -> None:
    seen: list[int] = []
    backend(fake).generate(reqs(6), on_result=lambda i, r: seen.append(i))
    assert sorted(seen) == list(range(6))


def test_generate_inside_running_loop(fake: FakeServer) -> None:
    async def main() -> list[Any]:
        return backend(fake).generate(reqs(2))  # sync call from async code: uses a thread

    out = asyncio.run(main())
    assert [r.data for r in out] == [{"n": 0}, {"n": 1}]


def test_agenerate_awaitable(fake: FakeServer) -> None:
    out = asyncio.run(backend(fake).agenerate(reqs(2)))
    assert [r.request_id for r in out] == ["r0", "r1"]


def test_empty_batch(fake: FakeServer) -> None:
    assert backend(fake).generate([]) == []


def test_api_key_sent_but_not_in_repr(fake: FakeServer) -> None:
    be = backend(fake, api_key="sk-secret")
    assert "sk-secret" not in repr(be)
    assert be.generate(reqs(1))[0].parse_ok


def test_dead_launched_server_fails_fast(fake: FakeServer) -> None:
    class DeadServer:
        name, log_path = "llm", "llm.server.log"
        process = type("P", (), {"returncode": -9})()

        def alive(self) -> bool:
            return False

    be = backend(fake, max_retries=4, retry_backoff_s=5.0)
    be.server = DeadServer()
    t = time.monotonic()
    out = be.generate(reqs(3))
    assert time.monotonic() - t < 1.0 and be.calls == 0
    assert all(r.finish_reason == "error" and "exited (code -9)" in (r.error or "") for r in out)
