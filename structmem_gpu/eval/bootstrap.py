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


def cluster_bootstrap_means(
    values: Sequence[float] | Sequence[bool],
    clusters: Sequence[object],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """Bootstrap means resampling whole clusters (LoCoMo's conversations) with replacement:
    each resample draws as many clusters as there are, and its mean is the drawn clusters'
    summed values over their summed sizes (every question of a drawn cluster counts, so
    questions of one conversation move together)."""
    x = np.asarray(values, dtype=np.float64)
    if len(clusters) != x.size:
        raise ValueError(f"{x.size} values but {len(clusters)} cluster labels")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    _, label = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    sums = np.bincount(label, weights=x)
    sizes = np.bincount(label).astype(np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples, dtype=np.float64)
    k = sums.size
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        idx = rng.integers(0, k, size=(stop - start, k))
        means[start:stop] = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    return means


def cluster_bootstrap_ci(
    values: Sequence[float] | Sequence[bool],
    clusters: Sequence[object],
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """(low, high) percentile interval of the mean, resampling clusters (`cluster_bootstrap_means`);
    None for an empty input. With few clusters (LoCoMo has 10) a percentile interval covers
    less than its level: docs/evaluation.md "Intervals" says by how much and what would fix it."""
    if len(values) == 0:
        return None
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    means = cluster_bootstrap_means(values, clusters, resamples=resamples, seed=seed)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def min_detectable_difference(
    n: int, discordant: float, *, alpha: float = 0.05, power: float = 0.8
) -> float | None:
    """The smallest accuracy difference a paired comparison of `n` questions detects with
    McNemar's test at two-sided `alpha` and `power`, when a share `discordant` of the pairs
    differ (Connor 1987: n = (z_a sqrt(psi) + z_b sqrt(psi - d^2))^2 / d^2, solved for d).
    None when n is 0 or no pair can differ."""
    from statistics import NormalDist

    if n <= 0 or discordant <= 0.0:
        return None
    psi = min(float(discordant), 1.0)
    z_a = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    z_b = NormalDist().inv_cdf(power)

    def needed(d: float) -> float:
        return (z_a * psi**0.5 + z_b * max(psi - d * d, 0.0) ** 0.5) ** 2 / (d * d)

    lo, hi = 1e-9, psi**0.5  # needed() falls as d grows; d cannot exceed sqrt(psi)
    if needed(hi) > n:
        return None  # even the largest difference these pairs allow is not detectable
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if needed(mid) > n else (lo, mid)
    return hi


def wilson_ci(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float] | None:
    """Wilson score 95% interval of a proportion (None for n = 0). Used for the judge audit's
    error rates: at 60 items a rate of 0/60 still gets an upper bound (about 6%), where a
    percentile bootstrap would return [0, 0]."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))
