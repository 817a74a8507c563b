"""The backend contract every LLM backend implements (HTTP servers, vLLM offline, scripted).

A stage builds its complete list of `LLMRequest`s and calls `backend.generate(requests)` once;
the backend returns one `LLMResult` per request, **in input order**. A result is never missing:
a request that failed after all retries comes back with `parse_ok=False` and `error` set, and
the stage records it (requests.parquet) instead of dropping it. A request that got no reply at
all is also `unanswered=True`: the pipeline then records its stage as incomplete.

Example request (extraction window):

    LLMRequest(request_id="extract:7f3a...", stage="extract", conv_id="conv-26",
               messages=(Message("system", "..."), Message("user", "[1] Caroline: ...")),
               schema={"type": "object", ...}, sampling=Sampling(max_tokens=512),
               prompt_version="factual/1")
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from structmem_gpu.core.hashing import (
    IdentityMemo,
    canonical_json,
    hash_canonical_parts,
    stable_hash,
)


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters sent explicitly with every request (never server defaults)."""

    temperature: float = 0.0
    max_tokens: int = 512
    top_p: float = 1.0
    seed: int | None = 0


@dataclass(frozen=True)
class LLMRequest:
    request_id: str  # unique within the run; stable across reruns (derived from content)
    stage: str
    messages: tuple[Message, ...]
    prompt_version: str  # e.g. "factual/1"; part of the cache key
    sampling: Sampling = field(default_factory=Sampling)
    schema: Mapping[str, Any] | None = None  # JSON schema the reply must satisfy; None = free text
    conv_id: str | None = None

    # Per-request hashing runs several times per request (cache key, messages hash, cache
    # row): the canonical JSON of the messages is built once and hashed with
    # core.hashing.hash_canonical_parts, which gives exactly stable_hash's digests.
    @functools.cached_property
    def messages_json(self) -> str:
        """canonical_json of the messages as dicts."""
        return canonical_json([m.as_dict() for m in self.messages])

    def messages_hash(self) -> str:
        """= stable_hash([m.as_dict() for m in self.messages], length=32)."""
        return hash_canonical_parts([self.messages_json], length=32)


_SCHEMA_JSON = IdentityMemo()


def schema_json(schema: Mapping[str, Any]) -> str:
    """canonical_json(dict(schema)), memoised per schema object (a schema is hashed with every
    request of its batch)."""
    return _SCHEMA_JSON.get(schema, lambda: canonical_json(dict(schema)))


@functools.lru_cache(maxsize=256)
def sampling_json(sampling: Sampling) -> str:
    """canonical_json(asdict(sampling)); Sampling is frozen and hashable and a batch shares one
    or two, so asdict's deep copy is not paid per request."""
    return canonical_json(asdict(sampling))


@dataclass(frozen=True)
class LLMResult:
    request_id: str
    text: str  # the final reply text ("" when every attempt failed)
    data: Any | None  # parsed JSON when a schema was given and the reply validated
    parse_ok: bool  # True for free-text requests that returned; schema validity otherwise
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    latency_s: float
    finish_reason: str  # "stop" | "length" | "error" | ...
    cache_hit: bool
    attempts: int  # HTTP attempts + repair attempts actually made (0 for a cache hit)
    messages_hash: str
    model: str
    error: str | None = None
    # True when no reply arrived at all (connection lost, server gone, timeout, 5xx after every
    # retry, not sent because the job is stopping): the request is not done, and a stage with
    # such a request is recorded as incomplete and resumed by a rerun. False for every reply
    # the server did give, including a refusal (HTTP 4xx) and a reply that did not parse.
    unanswered: bool = False
    salvaged: bool = False  # cut by max_tokens; `data` holds its complete list items only


class LLMBackend(Protocol):
    """Requests in, results out, order preserved."""

    model_id: str  # identifies weights (name + revision/path); part of every cache key

    def generate(self, requests: Sequence[LLMRequest], *, desc: str = "") -> list[LLMResult]: ...


# ---- request streams -----------------------------------------------------------------------
# A stage may hand `generate` an iterator instead of a list: its requests are then planned while
# the first ones are already at the server, instead of the server idling through all the
# planning (docs/performance.md, "GPU-paced builds"). A backend whose `streams` attribute is
# true takes an iterator as it is; the wrappers (dedup, cache, seed, supervisor) take one always
# and pass it on only to an inner backend that streams, a list otherwise. Results are in the
# requests' order either way.

Requests = Sequence[LLMRequest] | Iterator[LLMRequest]
T = TypeVar("T")


def streams(backend: Any) -> bool:
    """Whether `backend.generate` takes an iterator of requests as it is."""
    return bool(getattr(type(backend), "streams", False))


def noted(items: Iterable[T], drawn: list[T]) -> Iterator[T]:
    """`items`, each appended to `drawn` as it is drawn (a stream's requests, kept for the
    request log, for re-sending, for the cache's writes)."""
    for x in items:
        drawn.append(x)
        yield x


def request_id(stage: str, *key: Any) -> str:
    """Stable request id from the stage and what identifies the request's content."""
    return f"{stage}:{stable_hash(stage, *key)}"
