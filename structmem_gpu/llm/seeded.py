"""Every request of a job samples with the job's `llm.seed`.

Stages build their requests with `Sampling`'s default seed 0 and never name a seed of their
own; `open_llm` wraps the backend in `SeededBackend` when `llm.seed` is another value, so a
sweep `llm.seed=0,1,2` samples extraction and synthesis (temperature 0.1, top_p 0.1) under
three seeds: the seed is sent with each request (unless `llm.request_seed: false`) and is part
of every response-cache key, so one seed's cached replies never answer another's. Seed 0 (the
default) and null leave requests as they are, so existing caches stay valid.

    llm = SeededBackend(inner, seed=2)   # inner.generate sees sampling.seed == 2
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from structmem_gpu.llm.structured import OnResult
from structmem_gpu.llm.types import LLMBackend, LLMResult, Requests, streams


class SeededBackend:
    """Wraps any backend: each request's sampling seed becomes `seed`. Attributes it does not
    define (cache, hits, server, ...) are the inner backend's."""

    def __init__(self, inner: LLMBackend, seed: int) -> None:
        self.inner = inner
        self.seed = int(seed)
        self.model_id = inner.model_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"SeededBackend({self.inner!r}, seed={self.seed})"

    streams = True  # takes an iterator (llm/types.py); passes it on to a streaming inner

    def generate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        seeded = (replace(r, sampling=replace(r.sampling, seed=self.seed)) for r in requests)
        if isinstance(requests, Sequence) or not streams(self.inner):
            return self.inner.generate(list(seeded), desc=desc, on_result=on_result)
        return self.inner.generate(seeded, desc=desc, on_result=on_result, total=total)
