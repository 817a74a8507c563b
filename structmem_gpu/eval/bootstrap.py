"""Percentile bootstrap confidence intervals for a mean (judge accuracy), seeded.

    >>> bootstrap_ci([1, 0, 1, 1], resamples=1000, seed=0)
    (0.25, 1.0)

Resampling is vectorised with numpy (one `integers` draw of shape (resamples, n)), so 1,000
resamples of 1,540 questions take milliseconds; `report.bootstrap_resamples` trades CI
stability for time. The same seed and input give the same interval on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Rows per resampling chunk: keeps the (chunk, n) index matrix small for 500-question x 10k runs.
_CHUNK = 2_000


def bootstrap_ci(
    values: Sequence[float] | Sequence[bool],
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """(low, high) percentile interval of the mean; None for an empty input, the point for n=1."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        means[start:stop] = x[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)
