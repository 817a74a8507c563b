"""No request is sent over the model's context (docs/methods.md "Long inputs and the context guard").

`open_llm` gives every backend a `ContextGuard`: a request whose prompt tokens plus its
`max_tokens` exceed the model's context is not sent; it comes back failed with
finish_reason `over_context` (counted per stage in the manifest notes and report.json,
`over_context`), never silently dropped and never a server's HTTP 400 counted as a parse
failure. The context is the backend's context knob (llm/backends/: `llm.n_ctx` for llama.cpp,
`llm.max_model_len` for vLLM and external endpoints), or
what an attached server reports (`/v1/models` max_model_len, llama.cpp `/props` n_ctx):

    >>> limit = context_limit(LLMSettings(backend="llamacpp", n_ctx=8192))
    ContextLimit(tokens=8192, source='llm.n_ctx')

Prompt tokens are counted by `llm.tokenizer` when it is on this machine (with its chat
template), else conservatively as characters / 3 + 8 per message (English text runs about 4
characters per token, code and numbers fewer), so a prompt the guard lets through fits.
Every function here reads the typed llm settings (config/schema.py LLMSettings). The dry run
(node/dry_run.py) and the readers' context trimming count the same way.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.llm.tokens import TextCounter, optional_counter
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message

log = logging.getLogger(__name__)

OVER_CONTEXT = "over_context"  # finish_reason of a request the guard did not send
SAFE_CHARS_PER_TOKEN = 3
_MESSAGE_OVERHEAD = 8  # role markers and the chat template's framing, per message


@dataclass(frozen=True)
class ContextLimit:
    tokens: int | None  # None = unknown: nothing is refused
    source: str  # which key or endpoint said so


def _safe_count(messages: Sequence[Message]) -> int:
    chars = sum(len(m.content) for m in messages)
    return -(-chars // SAFE_CHARS_PER_TOKEN) + _MESSAGE_OVERHEAD * len(messages)


def guard_counter(c: LLMSettings | None) -> TextCounter:
    """The prompt counter of llm settings `c`: its tokenizer (`llm.tokenizer`, unset = the
    model's) when local, else the safe estimate (also for no settings)."""
    tok = None if c is None else c.tokenizer if c.tokenizer is not None else c.model
    counter = None
    if c is not None and tok not in (None, "chars"):
        counter = optional_counter(str(tok), c.revision if tok == c.model else None)
    if counter is None:
        return TextCounter("chars/3 (safe)", lambda t: -(-len(t) // SAFE_CHARS_PER_TOKEN))
    return counter


def count_prompt(counter: TextCounter, messages: Sequence[Message]) -> int:
    if counter.tokenizer is None:
        return _safe_count(messages)
    return counter.messages(messages)


def configured_limit(c: LLMSettings) -> ContextLimit:
    """The context the config states in its backend's context knob (Backend.context_knob:
    llama.cpp `n_ctx`, vLLM and external `max_model_len`), when set."""
    from structmem_gpu.llm.backends import backend

    knob = backend(c.backend).context_knob
    value = getattr(c, knob)
    if value:
        return ContextLimit(int(value), f"llm.{knob}")
    return ContextLimit(None, "unknown")


def reported_limit(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> int | None:
    """What a running server says its context is: vLLM's `/v1/models` max_model_len, or
    llama.cpp's `/props` n_ctx; None when it says neither (or does not answer)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = base_url.rstrip("/")
    def served(d: dict[str, Any]) -> Any:  # vLLM: data[].max_model_len
        lens = [m.get("max_model_len") for m in d.get("data") or [] if isinstance(m, dict)]
        return next((n for n in lens if n), None)

    def props(d: dict[str, Any]) -> Any:  # llama.cpp server
        return (d.get("default_generation_settings") or {}).get("n_ctx") or d.get("n_ctx")

    for url, pick in ((f"{root}/models", served), (f"{root.removesuffix('/v1')}/props", props)):
        try:
            req = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                value = pick(json.loads(r.read().decode("utf-8")))
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and value > 0:
            return value
    return None


def context_limit(c: LLMSettings, base_url: str | None = None,
                  api_key: str | None = None) -> ContextLimit:
    """The server's own report when attached to one (`base_url`), else the configured one."""
    if base_url:
        n = reported_limit(base_url, api_key)
        if n is not None:
            return ContextLimit(n, f"{base_url} reports")
    return configured_limit(c)


def over_context_error(prompt: int, max_tokens: int, limit: ContextLimit, counter: str) -> str:
    return (f"over context: {prompt} prompt tokens ({counter}) + {max_tokens} max_tokens > "
            f"{limit.tokens} ({limit.source}); not sent")


def refused(req: LLMRequest, prompt: int, error: str, model: str) -> LLMResult:
    return LLMResult(
        request_id=req.request_id, text="", data=None, parse_ok=False, prompt_tokens=prompt,
        completion_tokens=0, cached_tokens=None, latency_s=0.0, finish_reason=OVER_CONTEXT,
        cache_hit=False, attempts=0, messages_hash=req.messages_hash(), model=model, error=error,
    )


class ContextGuard:
    """The rule for one backend: `refusal(req)` is the over_context result of a request that
    does not fit, else None. CachedBackend / DedupBackend apply it to every request they would
    send (llm/dedup.py `send_distinct`); a cached reply was sent once and fit then."""

    def __init__(self, limit: ContextLimit, counter: TextCounter) -> None:
        self.limit = limit
        self.counter = counter
        self.refused = 0

    def __repr__(self) -> str:
        return f"ContextGuard({self.limit.tokens} by {self.counter.name})"

    def fits(self, messages: Sequence[Message], max_tokens: int) -> bool:
        return self.limit.tokens is None or (
            count_prompt(self.counter, messages) + max_tokens <= self.limit.tokens
        )

    def refusal(self, req: LLMRequest, model: str) -> LLMResult | None:
        if self.limit.tokens is None:
            return None
        n = count_prompt(self.counter, req.messages)
        if n + req.sampling.max_tokens <= self.limit.tokens:
            return None
        self.refused += 1
        return refused(req, n, over_context_error(n, req.sampling.max_tokens, self.limit,
                                                  self.counter.name), model)

