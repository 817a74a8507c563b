"""The recording front (structmem_gpu/systems/front.py): attribution by path, pass-through of
what foreign systems send (tools, logprobs, response_format), embeddings from our encoder
(base64 as the OpenAI SDK decodes it), the response cache, and the requests rows."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from structmem_gpu.systems.front import FrontCache, HTTPUpstream, RecordingFront, ScriptedUpstream
from structmem_gpu.systems.protocol import unit_url


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _embed(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), 1.0, 0.5] for t in texts], dtype=np.float32)


def _echo(body: dict[str, Any]) -> dict[str, Any]:
    last = body["messages"][-1]["content"]
    if body.get("tools"):
        return {"tool_calls": [{"id": "c0", "type": "function", "function": {
            "name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"x": last})}}]}
    return {"content": f"echo: {last}"}


CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0, "response_format": {"type": "json_object"}}


def test_chat_is_attributed_recorded_and_cached(tmp_path):
    cache = FrontCache(tmp_path / "cache")
    with RecordingFront(ScriptedUpstream(_echo), embed=_embed, cache=cache,
                        stage="system_build") as front:
        url = unit_url(front.url, "mem0", "build", "conv/26") + "/chat/completions"
        status, reply = _post(url, CHAT)
        assert status == 200 and reply["choices"][0]["message"]["content"] == "echo: hi"
        status2, reply2 = _post(url, {**CHAT, "model": "other-name"})  # model is not in the key
        assert status2 == 200 and reply2 == reply
        rows = front.take_rows()
    assert rows.height == 2
    assert rows["conv_id"].to_list() == ["conv/26", "conv/26"]  # unit ids with "/" survive
    assert rows["stage"].to_list() == ["system_build"] * 2
    assert rows["prompt_version"].to_list() == ["mem0/chat"] * 2
    assert rows["cache_hit"].to_list() == [False, True]
    assert rows["reply"][0] == "echo: hi"
    # published at close: a new front (a rerun) is answered from the cache
    calls: list[Any] = []

    def counting(body):
        calls.append(body)
        return _echo(body)

    with RecordingFront(ScriptedUpstream(counting), embed=_embed,
                        cache=FrontCache(tmp_path / "cache")) as front:
        url = unit_url(front.url, "mem0", "build", "conv/26") + "/chat/completions"
        assert _post(url, CHAT)[1] == reply
        assert _post(url, {**CHAT, "temperature": 0.5})[0] == 200  # another body: sent
        assert front.take_rows("s")["cache_hit"].to_list() == [True, False]
    assert len(calls) == 1
    # the body behind each row's messages_hash is kept (jobs/report.py differential reads it)
    kept = FrontCache(tmp_path / "cache")
    body = kept.body_for(rows["messages_hash"][0])
    assert body is not None and body["messages"] == CHAT["messages"]
    assert kept.body_for("0" * 64) is None


def test_tool_calls_pass_through_and_are_recorded():
    with RecordingFront(ScriptedUpstream(_echo), embed=_embed) as front:
        url = unit_url(front.url, "mem0_graph", "build", "c1") + "/chat/completions"
        body = {**CHAT, "tools": [{"type": "function", "function": {"name": "extract_entities",
                                                                    "parameters": {}}}],
                "tool_choice": "auto"}
        status, reply = _post(url, body)
        rows = front.take_rows("system_build")
    message = reply["choices"][0]["message"]
    assert status == 200 and message["tool_calls"][0]["function"]["name"] == "extract_entities"
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    assert "extract_entities" in rows["reply"][0]


def test_embeddings_from_the_encoder_float_and_base64():
    with RecordingFront(ScriptedUpstream(_echo), embed=_embed) as front:
        url = unit_url(front.url, "mem0", "search", "c1") + "/embeddings"
        status, out = _post(url, {"model": "m", "input": ["abc", "de"]})
        assert status == 200 and out["data"][0]["embedding"] == [3.0, 1.0, 0.5]
        status, out = _post(url, {"model": "m", "input": "abcd", "encoding_format": "base64"})
        vec = np.frombuffer(base64.b64decode(out["data"][0]["embedding"]), dtype="<f4")
        assert vec.tolist() == [4.0, 1.0, 0.5]
        status, out = _post(url, {"model": "m", "input": [[1, 2, 3]]})  # token ids
        assert status == 400 and "check_embedding_ctx_length=False" in out["error"]["message"]
        rows = front.take_rows("system_search")
    assert rows["prompt_version"].to_list() == ["mem0/embeddings"] * 3
    assert rows["parse_ok"].to_list() == [True, True, False]


def test_unknown_path_and_stream_are_refused():
    with RecordingFront(ScriptedUpstream(_echo), embed=_embed) as front:
        assert _post(front.url + "/v1/chat/completions", CHAT)[0] == 404
        url = unit_url(front.url, "x", "build", "c") + "/chat/completions"
        assert _post(url, {**CHAT, "stream": True})[0] == 400


class _Upstream(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def log_message(self, *a: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        out = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "ok"}}],
                          "usage": {"prompt_tokens": 11, "completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def upstream_server():
    _Upstream.bodies = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_http_upstream_forwards_the_body_with_the_served_name(upstream_server):
    up = HTTPUpstream(upstream_server, "smollm2", "smollm2|weights|")
    with RecordingFront(up, embed=_embed) as front:
        url = unit_url(front.url, "graphiti", "build", "c1") + "/chat/completions"
        body = {**CHAT, "logprobs": True, "top_logprobs": 2, "logit_bias": {"1": 5},
                "max_tokens": 1}
        status, reply = _post(url, body)
        rows = front.take_rows("system_build")
    sent = _Upstream.bodies[0]
    assert status == 200 and reply["choices"][0]["message"]["content"] == "ok"
    assert sent["model"] == "smollm2"
    assert {k: v for k, v in sent.items() if k != "model"} == {
        k: v for k, v in body.items() if k != "model"}
    assert rows["prompt_tokens"].to_list() == [11] and rows["model"][0] == "smollm2|weights|"


def test_unreachable_upstream_is_an_unanswered_row():
    up = HTTPUpstream("http://127.0.0.1:9/v1", "m", "m", timeout_s=5)
    with RecordingFront(up, embed=_embed) as front:
        url = unit_url(front.url, "mem0", "build", "c1") + "/chat/completions"
        status, out = _post(url, CHAT)
        rows = front.take_rows("system_build")
    assert status == 502 and "unreachable" in out["error"]["message"]
    assert rows["unanswered"].to_list() == [True] and rows["parse_ok"].to_list() == [False]


def test_the_reply_budget_cap_applies_before_the_key_and_the_upstream():
    seen: list[dict[str, Any]] = []

    def record(body):
        seen.append(dict(body))
        return {"content": "x"}

    with RecordingFront(ScriptedUpstream(record), embed=_embed, max_tokens=96) as front:
        url = unit_url(front.url, "mem0", "build", "c1") + "/chat/completions"
        _post(url, {**CHAT, "max_tokens": 2000})
        _post(url, CHAT)  # none set: the cap is set
        _post(url, {**CHAT, "max_completion_tokens": 50})  # under the cap: kept
    assert [b.get("max_tokens") for b in seen] == [96, 96, 96]
    assert seen[2]["max_completion_tokens"] == 50


def test_a_json_schema_body_goes_to_llamacpp_in_its_form():
    """llama-cpp-python answers response_format json_schema with HTTP 500 (graphiti, A-MEM
    send it): the front sends the same schema as {"type": "json_object", "schema": ...}."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = {**CHAT, "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "x", "schema": schema}}}
    llama = HTTPUpstream("http://127.0.0.1:9/v1", "smollm2", "m", flavor="llamacpp")
    assert llama.wire_body(body)["response_format"] == {"type": "json_object", "schema": schema}
    assert llama.wire_body(body)["model"] == "smollm2"
    assert llama.wire_body(CHAT)["response_format"] == {"type": "json_object"}  # untouched
    vllm = HTTPUpstream("http://127.0.0.1:9/v1", "qwen", "m")
    assert vllm.wire_body(body)["response_format"] == body["response_format"]
