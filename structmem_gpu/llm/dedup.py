"""In-batch request deduplication, with or without the response cache.

Identical requests inside one batch (same model, sampling, prompt version, schema and
messages) are sent once and the copies share the result. This is what makes LongMemEval-style
haystacks, where many questions draw the same sessions, extract each unique session once even
with `cache.llm=false`. CachedBackend (cache.py) does the same for its cache misses; open_llm
wraps an uncached backend in DedupBackend.

A copy's result keeps its own request_id, has attempts=0 and cache_hit=True when the sent
request parsed (it was served without a server call; requests.parquet counts it as not sent);
a failed original's failure is shared, so the copy is recorded as failed too, never dropped.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from structmem_gpu.hashing import stable_hash
from structmem_gpu.llm.structured import OnResult
from structmem_gpu.llm.types import LLMBackend, LLMRequest, LLMResult

logger = logging.getLogger(__name__)


def cache_key(model_id: str, req: LLMRequest, params: Mapping[str, Any] | None = None) -> str:
    """Content key of one request for one model (request_id and stage deliberately excluded:
    the same prompt in two stages is the same computation)."""
    return stable_hash(
        "llm-response/1",
        model_id,
        dict(params or {}),
        asdict(req.sampling),
        req.prompt_version,
        None if req.schema is None else dict(req.schema),
        [m.as_dict() for m in req.messages],
        length=40,
    )


def first_copies(keys: Sequence[str], skip: Sequence[bool] | None = None) -> dict[str, int]:
    """key -> index of the first request with that key (the copy that is sent); indices with
    skip[i] (already answered, e.g. from the cache) are left out."""
    first_of: dict[str, int] = {}
    for i, key in enumerate(keys):
        if skip is None or not skip[i]:
            first_of.setdefault(key, i)
    return first_of


def share_duplicates(
    requests: Sequence[LLMRequest],
    keys: Sequence[str],
    first_of: Mapping[str, int],
    results: list[LLMResult | None],
    on_result: OnResult | None,
) -> None:
    """Fill every unanswered slot from the sent copy with the same key (an in-batch hit, or
    the same failure)."""
    for i, key in enumerate(keys):
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


def send_batch(inner: LLMBackend, reqs: list[LLMRequest], desc: str, store: OnResult) -> None:
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

    def __init__(self, inner: LLMBackend) -> None:
        self.inner = inner
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
        first_of = first_copies(keys)
        send = list(first_of.values())
        self.sent += len(send)
        self.shared += len(requests) - len(send)
        if len(send) < len(requests):
            logger.info(
                "%s: %d distinct requests to send (of %d)", desc or "llm", len(send), len(requests)
            )
        results: list[LLMResult | None] = [None] * len(requests)

        def store(j: int, res: LLMResult) -> None:
            results[send[j]] = res
            if on_result is not None:
                on_result(send[j], res)

        if send:
            send_batch(self.inner, [requests[i] for i in send], desc, store)
        share_duplicates(requests, keys, first_of, results, on_result)
        return [r for r in results if r is not None]
