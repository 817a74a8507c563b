"""Reader prompts trimmed to the answer model's context, by each method's own order.

The context guard (llm/context_guard.py) refuses a request over the model's context; a reader
prompt should never get there. Each context builder says what its prompt looks like when it
keeps a `share` in [0, 1] of what it may drop (StructMem: the top share of its ranked entries
and syntheses; SEEM: its budget, dropped RPE passages first; full_context: its history budget),
and `fit_prompt` keeps the largest share that fits:

    fits = reader_fits(inputs.job)
    msgs, trimmed = fit_prompt(lambda share: build(keep_top(entries, share)), fits)

Prompts that fit as they are (every ordinary one) are built once and left unchanged.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from structmem_gpu.config.job import JobConfig
from structmem_gpu.llm.types import Message

M = TypeVar("M")
T = TypeVar("T")
_STEPS = 12  # binary-search steps over the share: 1/4096 resolution


def reader_fits(job: JobConfig) -> Callable[[Sequence[Message]], bool]:
    """`fits(messages)`: the prompt plus `answer.max_tokens` fits the answer model's context,
    by the context guard's own rule and counter (the configured context; no server asked)."""
    from structmem_gpu.llm.factory import config_guard

    from structmem_gpu.eval.answer import AnswerSettings

    guard = config_guard(job.root.llm)
    max_tokens = job.settings(AnswerSettings).max_tokens if job.has("answer") else 0
    return functools.partial(guard.fits, max_tokens=max_tokens)


def keep_top(items: Sequence[T], share: float) -> list[T]:
    """The best-ranked `share` of a list in rank order (at least one item while share > 0)."""
    return list(items[: math.ceil(len(items) * share)]) if share > 0 else []


def fit_prompt(build: Callable[[float], M], fits: Callable[[M], bool]) -> tuple[M, bool]:
    """(build(share) for the largest share that fits, whether it was trimmed). When even
    share 0 does not fit (the instructions alone), that prompt goes out and the guard records
    the request as over_context."""
    whole = build(1.0)
    if fits(whole):
        return whole, False
    lo, hi = 0.0, 1.0  # fits(build(lo)) is assumed; hi does not fit
    for _ in range(_STEPS):
        mid = (lo + hi) / 2
        if fits(build(mid)):
            lo = mid
        else:
            hi = mid
    return build(lo), True


def trim_note(what: str, trimmed: int, total: int) -> str | None:
    if not trimmed:
        return None
    return f"{what}: {trimmed} of {total} reader contexts trimmed to fit the model's context"


def messages_of(prompt: Any) -> Sequence[Message]:
    return prompt.messages if hasattr(prompt, "messages") else prompt
