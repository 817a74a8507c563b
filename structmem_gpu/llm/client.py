"""Async batch client for OpenAI-compatible chat servers (vLLM, llama.cpp, anything else).

    backend = HTTPBackend(base_url="http://127.0.0.1:8000/v1", served_name="qwen",
                          model_id="qwen|Qwen/Qwen2.5-7B-Instruct|", flavor="vllm",
                          max_in_flight=256)
    results = backend.generate(requests, desc="extract")   # same order as `requests`

`max_in_flight` workers each take the next request, send it (retrying connection errors,
timeouts, 429 and 5xx with exponential backoff), validate the reply and repair it once if
needed (structured.py). Every request yields exactly one result: a request that never got an
answer comes back with ``finish_reason="error"``, ``parse_ok=False`` and ``error`` set.
Works from sync code (own event loop) and from inside a running loop (runs in a thread).

Transport: aiohttp (what vLLM's own benchmark client uses), one keep-alive connection pool of
`max_in_flight` connections per batch. Its per-request cost stays flat from 1 to 1,024 in
flight; httpx's pool scanned every connection for every request (httpx issue #3215) and
capped the client near 140 requests/s at 256 in flight (docs/performance.md "Client ceiling").
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import json
import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.core import preempt
from structmem_gpu.core.hashing import IdentityMemo
from structmem_gpu.llm.structured import OnResult, RawReply, RepairState, response_format
from structmem_gpu.llm.types import LLMRequest, LLMResult, Requests

if TYPE_CHECKING:
    import aiohttp

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 425, 429})  # plus every 5xx
_MAX_BACKOFF_S = 60.0
_MAX_FAILURE_LOGS = 20
# Idle keep-alive connections are dropped before uvicorn's (vLLM, llama-cpp-python) 5 s server
# timeout, so a request is never written into a connection the server is closing.
_KEEPALIVE_S = 4.0
_JSON_HEADERS = {"Content-Type": "application/json"}
T = TypeVar("T")


class _Counter:
    """Process-wide count of chat requests sent over HTTP (tests assert zero on cache reruns)."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, k: int = 1) -> None:
        with self._lock:
            self._n += k

    @property
    def value(self) -> int:
        return self._n


HTTP_CALLS = _Counter()
# The llm config's defaults (config/schema.py LLMSettings), the one home of every default below.
_LLM = LLMSettings()


def request_body(
    req: LLMRequest, *, served_name: str, flavor: str, extra_body: Mapping[str, Any] | None = None,
    request_seed: bool = _LLM.request_seed,
) -> dict[str, Any]:
    """The JSON body of POST /chat/completions for one request.

        >>> request_body(req, served_name="smollm2", flavor="llamacpp")["response_format"]
        {'type': 'json_object', 'schema': {...}}

    Sampling is always explicit (never server defaults). Structured output goes only through
    `response_format`; vLLM silently ignores the removed guided-decoding fields.
    """
    s = req.sampling
    body: dict[str, Any] = {
        "model": served_name,
        "messages": [m.as_dict() for m in req.messages],
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stream": False,
    }
    # vLLM deprecates max_tokens for chat; llama.cpp only knows max_tokens.
    body["max_completion_tokens" if flavor == "vllm" else "max_tokens"] = s.max_tokens
    if s.seed is not None and request_seed:
        body["seed"] = s.seed
    if req.schema is not None:
        body["response_format"] = response_format(req.schema, flavor, name=_schema_name(req))
    for k, v in (extra_body or {}).items():
        body.setdefault(k, v)  # config extras never override the request's own fields
    return body


_FORMAT_JSON = IdentityMemo()


def request_payload(
    req: LLMRequest, *, served_name: str, flavor: str, extra_body: Mapping[str, Any] | None = None,
    request_seed: bool = _LLM.request_seed,
) -> bytes:
    """`request_body` as the bytes POSTed (the same JSON value, tests/unit/test_llm_client.py):
    the messages are the request's canonical JSON, built once already for its id and cache key,
    and `response_format`'s JSON is memoised with it, so only the small fields are encoded per
    request (a 7 kB prompt cost ~25 us to encode again)."""
    body = request_body(req, served_name=served_name, flavor=flavor, extra_body=extra_body,
                        request_seed=request_seed)
    body.pop("messages")  # the request's own (extras never override it)
    rf = body.pop("response_format", None)
    parts = [json.dumps(body)[:-1], ', "messages": ', req.messages_json]
    if rf is not None:  # the memoised dict of structured.response_format: one JSON text each
        parts += [', "response_format": ', _FORMAT_JSON.get(rf, lambda: json.dumps(rf))]
    return ("".join(parts) + "}").encode()


def _schema_name(req: LLMRequest) -> str:
    # OpenAI-style names allow [a-zA-Z0-9_-] only.
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in req.stage)[:64] or "reply"


def parse_completion(payload: Any) -> tuple[str, str, int, int, int | None]:
    """(text, finish_reason, prompt_tokens, completion_tokens, cached_tokens) of a response."""
    choice = payload["choices"][0]
    text = choice["message"].get("content") or ""
    finish = choice.get("finish_reason") or "stop"
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (
        str(text),
        str(finish),
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        None if cached is None else int(cached),
    )


# A stream (llm/types.py) is drawn this many requests at a time: planned one at a time between
# replies, LongMemEval-S-size extraction took 0.97-1.05 ms of framework CPU a request against
# 0.78 as a list; drawn 1,024 at a time, 0.83-0.84 (a tenth of it: 0.76 against 0.75), with the
# engine as busy (docs/performance.md, "GPU-paced builds").
DRAW_AHEAD = 1024


def run_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even when a loop is already running in
    this thread (Jupyter): then it runs on a fresh loop in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llm-client") as ex:
        return ex.submit(lambda: asyncio.run(factory())).result()  # type: ignore[arg-type]


class HTTPBackend:
    """`LLMBackend` over one OpenAI-compatible chat endpoint."""

    def __init__(
        self,
        *,
        base_url: str,
        served_name: str,
        model_id: str,
        flavor: str = "vllm",
        max_in_flight: int = _LLM.max_in_flight,
        request_timeout_s: float = _LLM.request_timeout_s,
        max_retries: int = _LLM.max_retries,
        retry_backoff_s: float = _LLM.retry_backoff_s,
        repair_attempts: int = _LLM.repair_attempts,
        extra_body: Mapping[str, Any] | None = None,
        api_key: str | None = None,
        progress: bool = _LLM.progress,
        request_seed: bool = _LLM.request_seed,
        reply_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self.model_id = model_id
        self.flavor = flavor
        self.max_in_flight = max(1, int(max_in_flight))
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.repair_attempts = int(repair_attempts)
        self.extra_body = dict(extra_body or {})
        self.request_seed = bool(request_seed)  # llm.request_seed: send each request's seed
        # The llm settings' reply knobs away from their defaults (config.identity.reply_params:
        # request_seed=false, repair_attempts ...): part of the response-cache key.
        self.reply_params = dict(reply_params or {})
        self._api_key = api_key  # never logged
        self.progress = progress
        self.calls = 0  # HTTP requests sent by this backend (retries and repairs included)
        self.server: Any = None  # the RunningServer when open_llm launched one
        self._failures_logged = 0
        self._down: str | None = None  # why the endpoint is considered down in this batch

    @property
    def _url(self) -> str:
        # Read per request: a replaced server (llm/supervisor.py) has a new base_url.
        return f"{self.base_url}/chat/completions"

    @property
    def cache_params(self) -> dict[str, Any]:
        """What changes the reply beyond the model (model_id) and the request (its sampling,
        messages, schema), hence part of the response-cache key: the body extras every request
        carries (llm.extra_body, llm.chat_template_kwargs), the reply knobs away from their
        defaults (`reply_params`) and an unconstrained structured-output flavor (json_mode). A
        knob at its default adds nothing, so every cache written before it entered the key
        stays valid."""
        from structmem_gpu.llm.structured import flavor_cache_params

        return {**self.extra_body, **self.reply_params, **flavor_cache_params(self.flavor)}

    def __repr__(self) -> str:
        return f"HTTPBackend({self.base_url!r}, model_id={self.model_id!r}, flavor={self.flavor!r})"

    streams = True  # generate takes an iterator of requests as well (llm/types.py)

    def generate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        """Send all requests; one result each, in input order. `on_result(i, result)` fires as
        each request finishes (the cache writes through it, so a crash keeps finished work).
        An iterator is drawn from as workers free up, so its planning overlaps the sending;
        `total` is its length when known (the progress bar's)."""
        return run_sync(lambda: self.agenerate(requests, desc=desc, on_result=on_result,
                                               total=total))

    async def agenerate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        if isinstance(requests, Sequence):
            total = len(requests)
            if total == 0:
                return []
        pulled: list[LLMRequest] = []  # every request drawn so far, by index
        results: dict[int, LLMResult] = {}
        source = iter(requests)
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total,
            desc=desc or "llm",
            unit="req",
            disable=not self.progress,
            mininterval=1.0,
            dynamic_ncols=True,
            leave=None,  # kept at the top level; cleared when nested (SEEM's "wave t/N" bar)
        )
        t0 = time.monotonic()
        out_tokens = 0
        # Circuit breaker: once one request has used up its retries without any reply, the rest
        # of the batch is not sent (each would wait through the same backoff): they come back
        # unanswered at once, and the stage is recorded incomplete naming this URL.
        self._down = None

        ahead: collections.deque[LLMRequest] = collections.deque()

        def draw() -> tuple[int, LLMRequest] | None:
            # Synchronous: a stream's planning runs here, between the loop's other work, and
            # no other worker can enter the iterator meanwhile; DRAW_AHEAD requests at a time.
            if not ahead:
                ahead.extend(itertools.islice(source, DRAW_AHEAD))
                if not ahead:
                    return None
            req = ahead.popleft()
            pulled.append(req)
            return len(pulled) - 1, req

        async def worker(client: aiohttp.ClientSession) -> None:
            nonlocal out_tokens
            while True:
                got = draw()
                if got is None:
                    return
                i, req = got
                if preempt.requested():  # stopping for requeue: nothing new goes out
                    res = unsent_result(req, self.model_id, _stopping("not sent"))
                elif self._down is not None:  # an earlier request exhausted its retries
                    res = unsent_result(req, self.model_id,
                                        f"not sent: {self.base_url} unreachable ({self._down})")
                else:
                    res = await self._one(client, req)
                results[i] = res
                out_tokens += res.completion_tokens
                if on_result is not None:
                    on_result(i, res)
                bar.update(1)
                if self.progress:  # formatting it for a disabled bar cost ~5 us a request
                    bar.set_postfix(
                        out_tok_s=f"{out_tokens / max(time.monotonic() - t0, 1e-9):.1f}",
                        refresh=False,
                    )

        try:
            async with self._client() as client:
                workers = min(self.max_in_flight, total or self.max_in_flight)
                tasks = [asyncio.create_task(worker(client)) for _ in range(workers)]
                watch = asyncio.create_task(_abandon_after_grace(tasks))
                await asyncio.wait(tasks)
                watch.cancel()
                for t in tasks:  # a worker's own error is a bug: raise it as before
                    if not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
        finally:
            bar.close()
        for i, req in enumerate(pulled):  # in flight when the preemption grace ran out
            if i not in results:
                results[i] = unsent_result(req, self.model_id, _stopping("abandoned in flight"))
                if on_result is not None:
                    on_result(i, results[i])
        # A stream's requests drawn ahead, or not drawn, when the grace ran out: every request
        # handed over gets its result (the wrappers count on one each), none is sent.
        for req in itertools.chain(ahead, source):
            pulled.append(req)
            results[len(pulled) - 1] = unsent_result(req, self.model_id, _stopping("not sent"))
            if on_result is not None:
                on_result(len(pulled) - 1, results[len(pulled) - 1])
        n = len(pulled)
        done = [results[i] for i in range(n)]
        failed = sum(not r.parse_ok for r in done)
        logger.info(
            "%s: %d requests in %.1f s (%d failed), %d completion tokens (%.1f tok/s) from %s",
            desc or "llm",
            n,
            time.monotonic() - t0,
            failed,
            out_tokens,
            out_tokens / max(time.monotonic() - t0, 1e-9),
            self.model_id,
        )
        return done

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        host = urlparse(self.base_url).hostname or ""
        return aiohttp.ClientSession(
            headers=headers,
            # The whole attempt is bounded by asyncio.timeout in _post; connect separately.
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=min(30.0, self.request_timeout_s)
            ),
            connector=aiohttp.TCPConnector(
                limit=self.max_in_flight, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S
            ),
            # A cluster's http_proxy must never capture loopback traffic; remote URLs may need it.
            trust_env=host not in ("127.0.0.1", "localhost", "::1"),
        )

    async def _one(self, client: aiohttp.ClientSession, req: LLMRequest) -> LLMResult:
        state = RepairState(req, self.repair_attempts)
        nxt: LLMRequest | None = req
        while nxt is not None:
            raw = await self._send(client, nxt)
            nxt = state.feed(raw)
        return state.result(self.model_id)

    async def _send(self, client: aiohttp.ClientSession, req: LLMRequest) -> RawReply:
        """One reply, retrying transient failures; never raises for server/network trouble."""
        payload = request_payload(
            req, served_name=self.served_name, flavor=self.flavor, extra_body=self.extra_body,
            request_seed=self.request_seed
        )
        error = "no attempt made"
        spent = 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.retry_backoff_s * 2 ** (attempt - 1), _MAX_BACKOFF_S)
                await asyncio.sleep(delay * random.uniform(0.9, 1.1))  # jitter: no thundering herd
            dead = self._server_death()
            if dead:
                # Our own server is gone: retrying every remaining request would only burn
                # backoff time. Fail fast; a rerun resends exactly these (cache).
                return RawReply("", "error", latency_s=spent, http_attempts=attempt, error=dead,
                                transport=True)
            if preempt.requested():  # stopping for requeue: no new attempt
                return RawReply("", "error", latency_s=spent, http_attempts=attempt,
                                error=f"not sent: job stopping ({preempt.signal_name()})",
                                transport=True)
            t = time.monotonic()
            self.calls += 1
            HTTP_CALLS.add()
            retry, outcome = await self._post(client, payload)
            spent += time.monotonic() - t
            if isinstance(outcome, tuple):
                text, finish, p_tok, c_tok, cached = outcome
                return RawReply(text, finish, p_tok, c_tok, cached, spent, attempt + 1)
            error = outcome
            self._log_failure(req, attempt, error, retry)
            if not retry:  # a refusal (HTTP 4xx): the server answered, resending won't help
                return RawReply(
                    "", "error", latency_s=spent, http_attempts=attempt + 1, error=error
                )
        if not error.startswith(("HTTP ", "timed out", "malformed")):  # no connection at all
            self._down = self._down or error
        return RawReply(
            "",
            "error",
            latency_s=spent,
            http_attempts=self.max_retries + 1,
            error=f"gave up after {self.max_retries + 1} attempts: {error}",
            transport=True,
        )

    def _server_death(self) -> str | None:
        """Why the server this backend launched is gone, or None (alive, or attached)."""
        srv = self.server
        if srv is None or srv.alive():
            return None
        return f"the {srv.name} server exited (code {srv.process.returncode}); see {srv.log_path}"

    def _log_failure(self, req: LLMRequest, attempt: int, error: str, retry: bool) -> None:
        # A dead endpoint fails every request several times: log the first few, then summarise.
        self._failures_logged += 1
        if self._failures_logged <= _MAX_FAILURE_LOGS:
            logger.warning(
                "%s attempt %d/%d failed%s: %s",
                req.request_id,
                attempt + 1,
                self.max_retries + 1,
                " (will retry)" if retry else "",
                error,
            )
        elif self._failures_logged == _MAX_FAILURE_LOGS + 1:
            logger.warning("further request failures are logged at DEBUG level")
        else:
            logger.debug("%s attempt %d failed: %s", req.request_id, attempt + 1, error)

    async def _post(
        self, client: aiohttp.ClientSession, payload: bytes
    ) -> tuple[bool, tuple[str, str, int, int, int | None] | str]:
        """(retryable, parsed reply or error message) of one POST of `payload` (request_payload)."""
        import aiohttp

        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with client.post(self._url, data=payload, headers=_JSON_HEADERS) as resp:
                    status = resp.status
                    raw = await resp.read()
        except TimeoutError:  # asyncio's, and aiohttp's ServerTimeoutError (a subclass)
            return True, f"timed out after {self.request_timeout_s:.0f} s"
        except aiohttp.ClientError as e:  # refused, reset, disconnected, broken payload...
            return True, f"{type(e).__name__}: {e or 'connection failed'}"
        if status != 200:
            retry = status >= 500 or status in _RETRY_STATUS
            return retry, f"HTTP {status}: {raw.decode(errors='replace')[:300]}"
        try:
            return False, parse_completion(json.loads(raw))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            # A 200 whose body is not a chat completion: a proxy or an overloaded server.
            text = raw.decode(errors="replace")[:200]
            return True, f"malformed response body ({type(e).__name__}): {text!r}"


def unsent_result(req: LLMRequest, model: str, error: str) -> LLMResult:
    """The (unanswered) result of a request the client gave up on without a reply: the job is
    stopping, or the endpoint was found unreachable by an earlier request of the batch."""
    return LLMResult(
        request_id=req.request_id, text="", data=None, parse_ok=False, prompt_tokens=0,
        completion_tokens=0, cached_tokens=None, latency_s=0.0, finish_reason="error",
        cache_hit=False, attempts=0, messages_hash=req.messages_hash(), model=model,
        error=error, unanswered=True,
    )


def _stopping(what: str) -> str:
    return f"{what}: job stopping ({preempt.signal_name()})"


async def _abandon_after_grace(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Once a stop signal arrived, give in-flight requests until the grace deadline, then
    cancel the workers (their requests come back unanswered; replies that landed are kept)."""
    while not preempt.requested():
        await asyncio.sleep(0.2)
    deadline = preempt.grace_deadline() or time.monotonic()
    while time.monotonic() < deadline and not all(t.done() for t in tasks):
        await asyncio.sleep(0.2)
    for t in tasks:
        t.cancel()


def api_key_from_env(var: str | None) -> str | None:
    """The API key for an external endpoint, read from the named environment variable."""
    if not var:
        return None
    key = os.environ.get(var)
    if key is None:
        logger.warning("llm.api_key_env=%s is not set; sending no API key", var)
    return key
