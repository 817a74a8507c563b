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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from structmem_gpu.core.hashing import canonical_json, hash_canonical_parts
from structmem_gpu.llm.structured import OnResult
from structmem_gpu.llm.types import (
    LLMBackend,
    LLMRequest,
    LLMResult,
    Requests,
    sampling_json,
    schema_json,
    streams,
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


# One request of a batch as send_distinct takes it: the request, its cache key, and its result
# when it is already known (a cache hit), else None.
Item = tuple[LLMRequest, str, LLMResult | None]


def send_distinct(
    inner: LLMBackend,
    items: Iterable[Item],
    *,
    desc: str = "",
    on_result: OnResult | None = None,
    on_sent: OnResult | None = None,
    guard: Any = None,
    stream: bool = False,
    total: int | None = None,
) -> tuple[list[LLMResult], int]:
    """One result per item, in order: a known one as it is; among the rest each distinct key
    is sent to `inner` once (the first copy) and the copies share its result. `on_sent(i,
    result)` sees each result that came from the server, before `on_result`. `guard`
    (llm/context_guard.py) answers a request over the model's context with its over_context
    failure instead of sending it. `stream=True` (the stage handed generate an iterator:
    llm/types.py) draws the items while `inner` sends, when `inner` streams (`total`: their
    number when known); otherwise every item is drawn first. Returns (results, number sent)."""
    reqs: list[LLMRequest] = []
    keys: list[str] = []
    results: list[LLMResult | None] = []
    first_of: dict[str, int] = {}  # key -> index of the copy that is actually sent
    send: list[int] = []
    refused: list[int] = []

    def distinct() -> Iterator[LLMRequest]:
        for req, key, known in items:
            i = len(reqs)
            reqs.append(req)
            keys.append(key)
            results.append(known)
            if known is not None:
                if on_result is not None:
                    on_result(i, known)
                continue
            if key in first_of:  # a copy: answered below from the first
                continue
            first_of[key] = i
            no = guard.refusal(req, inner.model_id) if guard is not None else None
            if no is not None:
                results[i] = no
                refused.append(i)
                if on_result is not None:
                    on_result(i, no)
                continue
            send.append(i)
            yield req

    def store(j: int, res: LLMResult) -> None:
        i = send[j]
        results[i] = res
        if on_sent is not None:
            on_sent(i, res)
        if on_result is not None:
            on_result(i, res)

    if stream and streams(inner):
        _send_batch(inner, distinct(), desc, store, total)
    else:
        batch = list(distinct())
        if batch:
            _send_batch(inner, batch, desc, store)
    if refused:
        logger.warning("%s: %d of %d requests over the model's context, not sent (first: %s)",
                       desc or "llm", len(refused), len(first_of), results[refused[0]].error)  # type: ignore[union-attr]
    for i, key in enumerate(keys):  # the copies: an in-batch hit, or the same failure
        if results[i] is not None:
            continue
        src = results[first_of[key]]
        if src is None:
            raise RuntimeError(f"request {reqs[first_of[key]].request_id} got no result")
        results[i] = replace(
            src, request_id=reqs[i].request_id, attempts=0, cache_hit=src.parse_ok
        )
        if on_result is not None:
            on_result(i, results[i])  # type: ignore[arg-type]
    return results, len(send)  # type: ignore[return-value]


def _send_batch(inner: LLMBackend, reqs: Requests, desc: str, store: OnResult,
                total: int | None = None) -> None:
    """Call `inner` with a per-result callback when it supports one (all backends of this
    package do, so results are stored as they arrive); otherwise store after the batch. An
    iterator goes only to a backend that streams, with its `total`."""
    extra = {"total": total} if not isinstance(reqs, Sequence) else {}
    if "on_result" in inspect.signature(inner.generate).parameters:
        inner.generate(reqs, desc=desc, on_result=store, **extra)  # type: ignore[call-arg]
        return
    for j, res in enumerate(inner.generate(reqs, desc=desc, **extra)):  # type: ignore[call-arg]
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

    streams = True  # takes an iterator (llm/types.py); passes it on to a streaming inner

    def generate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        params = getattr(self.inner, "cache_params", {})
        stream = not isinstance(requests, Sequence)
        items = ((r, cache_key(self.model_id, r, params), None) for r in requests)
        results, sent = send_distinct(
            self.inner, items, desc=desc, on_result=on_result, guard=self.guard, stream=stream,
            total=total,
        )
        self.sent += sent
        self.shared += len(results) - sent
        if sent < len(results):
            logger.info("%s: %d distinct requests sent (of %d)", desc or "llm", sent, len(results))
        return results
