"""The recording front: one loopback OpenAI-compatible server every baseline system talks to.

    with RecordingFront(upstream, embed=encode_fn, cache=FrontCache(cache_dir)) as front:
        url = unit_url(front.url, "mem0", "build", "conv-26")  # systems/protocol.py
        ...                                   # the system's workers call url + /chat/completions
        rows = front.request_rows("system_build")   # REQUESTS rows, one per call

A foreign system's LLM and embedding clients point at `front.url`; the URL path names the
system, phase and unit (`/u/<system>/<phase>/<unit>/v1/...`), so every call is attributed
without the system's cooperation.

- `POST .../chat/completions`: the body goes to the upstream unchanged except for `model`
  (set to the upstream's served name: some systems hard-code "gpt-4o-mini") and `stream`
  (refused: no system we run streams). Tool calls, `response_format`, logprobs and
  logit_bias pass through; to llama-cpp-python (flavor "llamacpp"), which answers a
  json_schema response_format with HTTP 500, the same schema goes in its json_object form
  (`HTTPUpstream.wire_body`; graphiti and A-MEM send json_schema). The upstream is the job's backend (vLLM, llama.cpp, an external
  endpoint: `HTTPUpstream`) or, for unit tests and the CI tier, the system's scripted replies
  (`ScriptedUpstream`).
- `POST .../embeddings`: served from the job's encoder (string or list-of-strings input;
  `encoding_format: base64` answered as little-endian float32, as the OpenAI SDK decodes it).
  Token-id inputs are refused with a 400 naming the client option that sends strings.
- `max_tokens` (a job's `system.max_tokens`, debug=ci) caps every chat body's reply budget
  before it is keyed and sent; unset, bodies go as the system wrote them.
- Repeats are served from the front's response cache (`FrontCache`, a segment store beside the
  LLM cache: no SQLite, no locks, safe on a shared filesystem), keyed by the upstream's model
  id and the canonical body (model and stream removed). Systems that put the time of day or
  random ids into prompts are made deterministic in their workers (clock frozen, ids seeded:
  systems/workers/worker_common.py), not by normalising the key.

Every call becomes one row of `requests.parquet` (schemas.REQUESTS): stage, conv_id (= the
unit), model, prompt_version = "<system>/<chat|embeddings>", tokens from the upstream's usage
(embeddings: input strings in prompt_tokens' place is wrong, so null), latency, cache_hit,
messages_hash = the body's sha256, reply = the content (or the tool calls as JSON).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import polars as pl

from structmem_gpu.core import schemas, segstore

log = logging.getLogger(__name__)

CACHE_DIRNAME = "system_responses.seg"  # under paths.cache_dir/llm, beside llm_responses.seg
CACHE_KIND = "front-response"
CACHE_FORMAT = "front/1"
PUBLISH_EVERY = 64  # replies per published segment (and at close)
BODY_PREFIX = "body/"  # key prefix of the stored chat bodies (FrontCache.body_for)


def body_key(model_id: str, body: Mapping[str, Any]) -> str:
    """The cache key of one chat body: what the upstream sees, model name aside."""
    rest = {k: v for k, v in body.items() if k not in ("model", "stream", "user")}
    canon = json.dumps({"model_id": model_id, "body": rest}, sort_keys=True, ensure_ascii=False,
                       separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def body_hash(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class FrontCache:
    """Replies of the front by body key (one segment store; publishes in batches)."""

    def __init__(self, root: Path) -> None:
        self.store = segstore.SegmentStore(Path(root), kind=CACHE_KIND, fmt=CACHE_FORMAT)
        self._pending: list[tuple[str, bytes, str | None]] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            for k, payload, _t in self._pending:
                if k == key:
                    return json.loads(payload)
            got = self.store.get_many([key]).get(key)
        return None if got is None else json.loads(got)

    def put(self, key: str, reply: Mapping[str, Any],
            body: Mapping[str, Any] | None = None) -> None:
        """Store a reply; with `body`, also the body under BODY_PREFIX + its sha256 (the
        requests row's messages_hash), so `jobs/report.py differential` can read what a system
        sent, as LLMCache.messages_for does for our own stages."""
        with self._lock:
            sha = body_hash(body) if body is not None else None
            self._pending.append((key, json.dumps(reply).encode(), sha))
            if body is not None:
                self._pending.append((BODY_PREFIX + sha, json.dumps(body).encode(), None))
            if len(self._pending) >= PUBLISH_EVERY:
                self._flush()

    def body_for(self, sha256: str) -> dict[str, Any] | None:
        """The chat body behind a front row's messages_hash (None: not stored, e.g. a cache
        written before bodies were kept, or a call that got no reply)."""
        return self.get(BODY_PREFIX + sha256)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self.store.publish(pending)

    def close(self) -> None:
        with self._lock:
            self._flush()


class UpstreamError(Exception):
    """The upstream gave no usable reply (status, transport)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HTTPUpstream:
    """An OpenAI-compatible chat endpoint (the job's vLLM / llama.cpp server or an external one)."""

    def __init__(self, base_url: str, served_name: str, model_id: str, *,
                 api_key: str | None = None, timeout_s: float = 600.0,
                 flavor: str = "vllm") -> None:
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self.model_id = model_id
        self._api_key = api_key  # never logged
        self.timeout_s = timeout_s
        # The backend's structured-output form (llm/structured.py FLAVORS): a system's
        # json_schema response_format is sent in it (`wire_body`)
        self.flavor = flavor
        # A loopback upstream (the job's own server) never goes through a proxy from the
        # environment; an external endpoint is reached as the environment says.
        host = urllib.parse.urlparse(self.base_url).hostname or ""
        loopback = host in ("127.0.0.1", "localhost", "::1")
        self._opener = urllib.request.build_opener(
            *([urllib.request.ProxyHandler({})] if loopback else []))

    def wire_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The body as this backend takes it: `model` its served name; for llama-cpp-python
        (flavor "llamacpp", which answers json_schema with HTTP 500) a system's
        `{"type": "json_schema", "json_schema": {"schema": S}}` as `{"type": "json_object",
        "schema": S}`, the same constraint in its form. The cache key and the requests row keep
        the body the system sent."""
        out = {**body, "model": self.served_name}
        fmt = out.get("response_format")
        if self.flavor == "llamacpp" and isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            out["response_format"] = ({"type": "json_object", "schema": schema}
                                      if isinstance(schema, Mapping) else {"type": "json_object"})
        return out

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        data = json.dumps(self.wire_body(body)).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=data,
                                     headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise UpstreamError(e.code, e.read().decode(errors="replace")[:2000]) from e
        except (urllib.error.URLError, OSError) as e:
            raise UpstreamError(502, f"{self.base_url} unreachable: {e}") from e


class ScriptedUpstream:
    """The system's scripted replies (systems/<name>.py scripted_reply): no model at all."""

    model_id = "scripted-system"

    def __init__(self, reply: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
        self.reply = reply

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        message = {"role": "assistant", "content": None, **self.reply(body)}
        # A scripted reply may carry logprobs (graphiti's reranker reads them): they belong to
        # the choice, as a server puts them.
        logprobs = message.pop("logprobs", None)
        text = message.get("content") or json.dumps(message.get("tool_calls") or [])
        prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", [])) // 4
        return {
            "id": "scripted", "object": "chat.completion", "created": 0, "model": self.model_id,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt + len(text) // 4},
        }


Upstream = HTTPUpstream | ScriptedUpstream


@dataclass
class _Call:
    stage: str
    system: str
    phase: str
    unit: str
    endpoint: str
    body_sha256: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    cache_hit: bool
    reply: str | None
    error: str | None
    finish_reason: str | None = None
    seq: int = 0


@dataclass
class FrontStats:
    chat: int = 0
    embeddings: int = 0
    cache_hits: int = 0
    errors: int = 0
    by_unit: dict[str, int] = field(default_factory=dict)


class RecordingFront:
    """The loopback server (a thread of the job): see the module docstring."""

    def __init__(self, upstream: Upstream, *, embed: Callable[[Sequence[str]], Any],
                 cache: FrontCache | None = None, stage: str = "",
                 max_tokens: int | None = None) -> None:
        self.upstream = upstream
        self.max_tokens = max_tokens  # cap on every chat body's reply budget (None = as sent)
        self._embed = embed
        self._embed_lock = threading.Lock()  # the encoder is not thread-safe
        self.cache = cache
        self.stage = stage  # the stage its calls are attributed to (set per stage)
        self._calls: list[_Call] = []
        self._lock = threading.Lock()
        self.stats = FrontStats()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> "RecordingFront":
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:  # noqa: D102 - quiet
                log.debug("front: " + fmt, *args)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._send(200, {"object": "list", "data": [{"id": front.upstream.model_id}]})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status, payload = front.handle(self.path, raw)
                self._send(status, payload)

            def _send(self, status: int, payload: Mapping[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="front",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.cache is not None:
            self.cache.close()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the front is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- requests -----------------------------------------------------------------------

    def handle(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """One POST: (status, JSON reply). Never raises (the system sees an HTTP error)."""
        system, phase, unit, endpoint = _route(path)
        if endpoint is None:
            return 404, {"error": {"message": f"unknown path {path!r}: expected "
                                              "/u/<system>/<phase>/<unit>/v1/{chat/completions,embeddings}"}}
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            return 400, {"error": {"message": f"body is not JSON: {e}"}}
        if endpoint == "embeddings":
            return self._embeddings(system, phase, unit, body)
        return self._chat(system, phase, unit, body)

    def _chat(self, system: str, phase: str, unit: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("stream"):
            return 400, {"error": {"message": "stream=true is not supported by the recording front"}}
        t0 = time.perf_counter()
        if self.max_tokens is not None:  # the capped body is what the upstream sees and keys
            for name in ("max_tokens", "max_completion_tokens"):
                if name in body or name == "max_tokens":
                    body[name] = min(int(body.get(name) or self.max_tokens), self.max_tokens)
        sha = body_hash(body)
        key = body_key(self.upstream.model_id, body)
        reply = self.cache.get(key) if self.cache is not None else None
        hit = reply is not None
        error = None
        if reply is None:
            try:
                reply = self.upstream.chat(body)
            except UpstreamError as e:
                error = f"upstream {e.status}: {e}"
                self._record(system, phase, unit, "chat", sha, None, None, t0, False, None, error)
                return e.status if 400 <= e.status < 600 else 502, {"error": {"message": error}}
            except Exception as e:  # a scripted reply that raised: the system sees a 500
                error = f"{type(e).__name__}: {e}"
                self._record(system, phase, unit, "chat", sha, None, None, t0, False, None, error)
                return 500, {"error": {"message": error}}
            if self.cache is not None:
                self.cache.put(key, reply, body)
        usage = reply.get("usage") or {}
        choice = (reply.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        text = message.get("content")
        if text is None and message.get("tool_calls"):
            text = json.dumps(message["tool_calls"], sort_keys=True)
        self._record(system, phase, unit, "chat", sha, usage.get("prompt_tokens"),
                     usage.get("completion_tokens"), t0, hit, text, error,
                     choice.get("finish_reason"))
        return 200, reply

    def _embeddings(self, system: str, phase: str, unit: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        t0 = time.perf_counter()
        raw_input = body.get("input")
        texts = [raw_input] if isinstance(raw_input, str) else list(raw_input or [])
        if not texts or not all(isinstance(t, str) for t in texts):
            msg = ("embeddings input must be a string or a list of strings (token ids are not "
                   "accepted: e.g. langchain's OpenAIEmbeddings(check_embedding_ctx_length=False) "
                   "sends strings)")
            self._record(system, phase, unit, "embeddings", body_hash(body), None, None, t0,
                         False, None, msg)
            return 400, {"error": {"message": msg}}
        with self._embed_lock:
            matrix = np.asarray(self._embed([t if t.strip() else " " for t in texts]),
                                dtype=np.float32)
        b64 = body.get("encoding_format") == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode() if b64
                 else row.tolist()}
                for i, row in enumerate(matrix)]
        self._record(system, phase, unit, "embeddings", body_hash(body), None, None, t0, False,
                     None, None)
        n = sum(len(t) for t in texts) // 4
        return 200, {"object": "list", "data": data, "model": body.get("model") or "encoder",
                     "usage": {"prompt_tokens": n, "total_tokens": n}}

    def _record(self, system: str, phase: str, unit: str, endpoint: str, sha: str,
                prompt_tokens: int | None, completion_tokens: int | None, t0: float, hit: bool,
                reply: str | None, error: str | None, finish: str | None = None) -> None:
        call = _Call(self.stage, system, phase, unit, endpoint, sha, prompt_tokens,
                     completion_tokens, time.perf_counter() - t0, hit, reply, error, finish)
        with self._lock:
            call.seq = len(self._calls)
            self._calls.append(call)
            st = self.stats
            if endpoint == "chat":
                st.chat += 1
            else:
                st.embeddings += 1
            st.cache_hits += hit
            st.errors += error is not None
            st.by_unit[unit] = st.by_unit.get(unit, 0) + 1

    def take_rows(self, stage: str | None = None) -> pl.DataFrame:
        """The calls recorded since the last take, as REQUESTS rows (ordered by arrival)."""
        with self._lock:
            calls, self._calls = self._calls, []
        rows = [{
            "request_id": f"{c.stage or stage}:{c.system}:{c.phase}:{c.unit}:{c.seq}",
            "stage": c.stage or stage,
            "conv_id": c.unit,
            "model": self.upstream.model_id if c.endpoint == "chat" else "encoder",
            "prompt_version": f"{c.system}/{c.endpoint}",
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "cached_tokens": None,
            "latency_s": float(c.latency_s),
            "finish_reason": c.finish_reason,
            "parse_ok": c.error is None,
            "salvaged": False,
            "cache_hit": c.cache_hit,
            "attempts": 0 if c.cache_hit else 1,
            "messages_hash": c.body_sha256,
            "reply": c.reply,
            "error": c.error,
            "unanswered": c.error is not None and c.error.startswith("upstream 502"),
        } for c in calls]
        return schemas.frame(rows, schemas.REQUESTS)


def _route(path: str) -> tuple[str, str, str, str | None]:
    """`/u/<system>/<phase>/<unit>/v1/<endpoint>` -> its parts (endpoint None = no route)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if len(parts) < 6 or parts[0] != "u" or parts[4] != "v1":
        return "", "", "", None
    endpoint = "/".join(parts[5:])
    if endpoint not in ("chat/completions", "embeddings"):
        return "", "", "", None
    return (unquote(parts[1]), parts[2], unquote(parts[3]),
            "chat" if endpoint == "chat/completions" else "embeddings")
