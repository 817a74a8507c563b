"""Token-budget packing of extraction windows (`extract.window_tokens`).

The reference code sends one extraction request pair per batch of about 512 tokens of
LLMLingua-2-compressed text (rate 0.6, i.e. about 850 raw tokens; docs/methods.md
"StructMem: extraction").
We pack consecutive turns of ONE session up to a token budget instead (never across sessions):

    >>> pack_lengths([300, 300, 300, 100], budget=850)
    [(0, 2), (2, 4)]

Among the packings with the fewest windows (greedy's count), the smallest per-window budget
that still achieves that count is used, so a session of 900 tokens becomes two windows of
about 450 rather than 850 + 50. A single turn longer than the budget is a window of its own.

Tokens are counted by the model's tokenizer when it is on disk (`llm.model` a local folder or
an HF id in the local cache), otherwise as characters / 4 (GGUF models, API endpoints).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4


def _greedy(lengths: Sequence[int], budget: int, max_turns: int | None) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        full = max_turns is not None and i - start >= max_turns
        if i > start and (total + n > budget or full):
            out.append((start, i))
            start, total = i, 0
        total += n
    if start < len(lengths):
        out.append((start, len(lengths)))
    return out


def pack_lengths(
    lengths: Sequence[int], budget: int, max_turns: int | None = None
) -> list[tuple[int, int]]:
    """(start, end) slices of consecutive items whose lengths sum to at most `budget`
    (an item longer than the budget alone), fewest windows, balanced."""
    if budget < 1:
        raise ValueError(f"window token budget must be >= 1, got {budget}")
    best = _greedy(lengths, budget, max_turns)
    if len(best) <= 1:
        return best
    lo, hi = max(max(lengths), -(-sum(lengths) // len(best))), budget
    while lo < hi:  # the smallest budget that keeps greedy's window count
        mid = (lo + hi) // 2
        if len(_greedy(lengths, mid, max_turns)) <= len(best):
            hi = mid
        else:
            lo = mid + 1
    return _greedy(lengths, lo, max_turns)


def chars_tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def text_token_counter(llm_cfg: Any) -> tuple[str, Callable[[str], int]]:
    """(name, count): the model's tokenizer when it is on disk (no download), else chars/4."""
    model = llm_cfg.get("model") if llm_cfg is not None else None
    if not model or str(model).endswith(".gguf"):
        return "chars/4", chars_tokens
    try:
        from transformers import AutoTokenizer

        path = Path(str(model)).expanduser()
        tok = AutoTokenizer.from_pretrained(
            str(path) if path.is_dir() else str(model),
            local_files_only=True,
            revision=llm_cfg.get("revision"),
        )
    except (OSError, ValueError, ImportError) as e:
        log.info("window packing: no local tokenizer for %s (%s); counting chars / 4", model, e)
        return "chars/4", chars_tokens
    return f"tokenizer:{model}", lambda t: len(tok.encode(t, add_special_tokens=False))
