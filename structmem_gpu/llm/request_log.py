"""One row per LLM request for `tables/requests.parquet` (schema `structmem_gpu.core.schemas.REQUESTS`).

    df = to_frame(requests, results)
    # request_id='extract:7f3a..', stage='extract', conv_id='conv-26', model='smollm2|...|',
    # prompt_version='factual/1', prompt_tokens=133, completion_tokens=117, cached_tokens=None,
    # latency_s=3.5, finish_reason='stop', parse_ok=True, cache_hit=False, attempts=1,
    # messages_hash='9c1e..', reply='{"entries": [...]}', error=None

Cache-hit rows keep the token counts of the original computation, so build cost can be
reported with and without the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from structmem_gpu.llm.types import LLMRequest, LLMResult
from structmem_gpu.core.schemas import REQUESTS, frame


def to_frame(requests: Sequence[LLMRequest], results: Sequence[LLMResult]) -> pl.DataFrame:
    """Join requests with their results (same order, matched by request_id) into REQUESTS rows."""
    if len(requests) != len(results):
        raise ValueError(f"{len(requests)} requests but {len(results)} results")
    rows = []
    for req, res in zip(requests, results, strict=True):
        if req.request_id != res.request_id:
            raise ValueError(
                f"result {res.request_id!r} does not belong to request {req.request_id!r}"
            )
        rows.append(
            {
                "request_id": req.request_id,
                "stage": req.stage,
                "conv_id": req.conv_id,
                "model": res.model,
                "prompt_version": req.prompt_version,
                "prompt_tokens": res.prompt_tokens,
                "completion_tokens": res.completion_tokens,
                "cached_tokens": res.cached_tokens,
                "latency_s": float(res.latency_s),
                "finish_reason": res.finish_reason,
                "parse_ok": res.parse_ok,
                "salvaged": res.salvaged,
                "cache_hit": res.cache_hit,
                "attempts": res.attempts,
                "messages_hash": res.messages_hash,
                "reply": res.text,
                "error": res.error,
                "unanswered": res.unanswered,
            }
        )
    return frame(rows, REQUESTS)
