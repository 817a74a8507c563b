"""In-batch request deduplication, with or without the response cache.

Identical requests inside one batch (same model, sampling, prompt version, schema and
messages) are sent once and the copies share the result. This is what makes LongMemEval-style
haystacks, where many questions draw the same sessions, extract each unique session once even
with `cache.llm=false`. Both wrappers send through `send_distinct`: CachedBackend (cache.py)
for its cache misses, DedupBackend (what open_llm yields without a cache) for everything.

A copy's result keeps its own request_id, has attempts=0 and cache_hit=True when the sent
request parsed (it was served without a server call; requests.parquet counts it as not sent);
a failed original's failure is shared, so the copy is recorded as failed too, never dropped.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from structmem_gpu.core.hashing import canonical_json, hash_canonical_parts
from structmem_gpu.llm.structured import OnResult
from structmem_gpu.llm.types import (
    LLMBackend,
    LLMRequest,
    LLMResult,
    sampling_json,
    schema_json,
)

logger = logging.getLogger(__name__)


KEY_VERSION = "llm-response/1"  # bump when cache_key changes; the cache file records it


def cache_key(model_id: str, req: LLMRequest, params: Mapping[str, Any] | None = None) -> str:
    """Content key of one request for one model (request_id and stage deliberately excluded:
    the same prompt in two stages is the same computation).

    = stable_hash(KEY_VERSION, model_id, dict(params or {}), asdict(req.sampling),
    req.prompt_version, None if req.schema is None else dict(req.schema),
    [m.as_dict() for m in req.messages], length=40), built from the request's memoised
    canonical pieces (tests/unit/test_llm_hashing.py holds the two equal)."""
    return hash_canonical_parts([
        canonical_json(KEY_VERSION),
        canonical_json(model_id),
        canonical_json(dict(params or {})),
        sampling_json(req.sampling),
        canonical_json(req.prompt_version),
        "null" if req.schema is None else schema_json(req.schema),
        req.messages_json,
    ], length=40)


def send_distinct(
    inner: LLMBackend,
    requests: Sequence[LLMRequest],
    keys: Sequence[str],
    results: list[LLMResult | None],
    *,
    desc: str = "",
    on_result: OnResult | None = None,
    on_sent: OnResult | None = None,
    guard: Any = None,
) -> int:
    """Fill every empty slot of `results`: each distinct key among them is sent to `inner` once
    (the first copy), the copies share its result. Slots already filled (e.g. cache hits) are
    left alone. `on_sent(i, result)` sees each result that came from the server, before
    `on_result`. `guard` (llm/context_guard.py) answers a request over the model's context
    with its over_context failure instead of sending it. Returns the number of requests sent."""
    first_of: dict[str, int] = {}  # key -> index of the copy that is actually sent
    for i, key in enumerate(keys):
        if results[i] is None:
            first_of.setdefault(key, i)
    send = []
    for i in first_of.values():
        no = guard.refusal(requests[i], inner.model_id) if guard is not None else None
        if no is None:
            send.append(i)
            continue
        results[i] = no
        if on_result is not None:
            on_result(i, no)
    if len(send) < len(first_of):
        first = next(results[i] for i in first_of.values() if results[i] is not None)
        logger.warning("%s: %d of %d requests over the model's context, not sent (first: %s)",
                       desc or "llm", len(first_of) - len(send), len(first_of), first.error)

    def store(j: int, res: LLMResult) -> None:
        i = send[j]
        results[i] = res
        if on_sent is not None:
            on_sent(i, res)
        if on_result is not None:
            on_result(i, res)

    if send:
        _send_batch(inner, [requests[i] for i in send], desc, store)
    for i, key in enumerate(keys):  # the copies: an in-batch hit, or the same failure
        if results[i] is not None:
            continue
        src = results[first_of[key]]
        if src is None:
            raise RuntimeError(f"request {requests[first_of[key]].request_id} got no result")
        results[i] = replace(
            src, request_id=requests[i].request_id, attempts=0, cache_hit=src.parse_ok
        )
        if on_result is not None:
            on_result(i, results[i])  # type: ignore[arg-type]
    return len(send)


def _send_batch(inner: LLMBackend, reqs: list[LLMRequest], desc: str, store: OnResult) -> None:
    """Call `inner` with a per-result callback when it supports one (all backends of this
    package do, so results are stored as they arrive); otherwise store after the batch."""
    if "on_result" in inspect.signature(inner.generate).parameters:
        inner.generate(reqs, desc=desc, on_result=store)  # type: ignore[call-arg]
        return
    for j, res in enumerate(inner.generate(reqs, desc=desc)):
        store(j, res)


class DedupBackend:
    """Wraps any backend: sends each distinct request of a batch once. Attributes it does not
    define (server, cache_params, ...) are the inner backend's."""

    def __init__(self, inner: LLMBackend, guard: Any = None) -> None:
        self.inner = inner
        self.guard = guard  # llm/context_guard.py; None = no context check
        self.model_id = inner.model_id
        self.sent = 0  # distinct requests passed to the inner backend
        self.shared = 0  # copies answered from a sent request of the same batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"DedupBackend({self.inner!r})"

    def generate(
        self, requests: Sequence[LLMRequest], *, desc: str = "", on_result: OnResult | None = None
    ) -> list[LLMResult]:
        params = getattr(self.inner, "cache_params", {})
        keys = [cache_key(self.model_id, r, params) for r in requests]
        results: list[LLMResult | None] = [None] * len(requests)
        sent = send_distinct(
            self.inner, requests, keys, results, desc=desc, on_result=on_result, guard=self.guard
        )
        self.sent += sent
        self.shared += len(requests) - sent
        if sent < len(requests):
            logger.info("%s: %d distinct requests sent (of %d)", desc or "llm", sent, len(requests))
        return [r for r in results if r is not None]
