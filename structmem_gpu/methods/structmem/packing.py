"""Token-budget packing of extraction windows (`extract.window_tokens`).

The reference code sends one extraction request pair per batch of about 512 tokens of
LLMLingua-2-compressed text (rate 0.6, i.e. about 850 raw tokens; docs/methods.md
"StructMem: extraction").
We pack consecutive turns of ONE session up to a token budget instead (never across sessions):

    >>> pack_lengths([300, 300, 300, 100], budget=850)
    [(0, 2), (2, 4)]

Among the packings with the fewest windows (greedy's count), the smallest per-window budget
that still achieves that count is used, so a session of 900 tokens becomes two windows of
about 450 rather than 850 + 50. A turn longer than the budget is first cut into parts of at
most the budget (`split_text`; extract.py keeps each part's turn id and speaker), so no window
exceeds it.

Tokens are counted by `extract.window_tokenizer` (structmem_gpu/llm/tokens.py): `chars`
(characters / 4) or an HF tokenizer that must be on this machine, so every machine cuts the
same windows (docs/methods.md "Extraction windows").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


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


def _cut_near(text: str, pos: int, lo: int) -> int:
    """A cut at or before `pos` (after `lo`): just after a newline, else after a space, looked
    for in the last eighth of the piece; `pos` itself when the text has neither there."""
    floor = max(lo + 1, pos - max(1, (pos - lo) // 8))
    for sep in ("\n", " "):
        at = text.rfind(sep, floor, pos)
        if at >= 0:
            return at + 1
    return pos


def split_text(text: str, budget: int, count: Callable[[str], int]) -> list[str]:
    """`text` as consecutive pieces of at most `budget` tokens by `count` (fewest even pieces
    the count allows, cut at whitespace where possible); the pieces joined are the text
    (whitespace at a cut aside):

        >>> split_text("aaaa bbbb cccc dddd", 2, lambda t: len(t) // 4)
        ['aaaa bbbb', 'cccc dddd']
    """
    budget = max(1, budget)
    if count(text) <= budget:
        return [text]
    n = -(-count(text) // budget)
    while True:
        cuts: list[int] = [0]
        for i in range(1, n):
            cuts.append(max(cuts[-1] + 1, _cut_near(text, round(i * len(text) / n), cuts[-1])))
        cuts.append(len(text))
        pieces = [text[a:b].strip() for a, b in zip(cuts, cuts[1:], strict=False)]
        pieces = [p for p in pieces if p]
        if n >= len(text) or all(count(p) <= budget for p in pieces):
            return pieces
        n = min(len(text), n + max(1, n // 10))
