"""Small numeric helpers of the harness: rates, least-squares line, growth exponent.

    linear_fit([10, 100, 1000], [2.1, 12.0, 111.5])   # LinearFit(slope=0.11, intercept=1.0, r2=1.0)
    growth_exponent([10, 100, 1000], [2.1, 12.0, 111.5])   # 0.97: ~linear at the large end

Linear growth shows as a constant marginal cost per conversation: `growth_exponent` is the
log-log slope between the two largest sizes (a fixed start-up cost fades there; 1.0 = linear,
2.0 = quadratic) and `marginal_ratio` compares the cost per added conversation at the large
end with that at the small end (about 1 when linear, growing with n when superlinear).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LinearFit:
    slope: float  # y units per x unit (seconds per conversation)
    intercept: float  # fixed cost (seconds)
    r2: float  # 1.0 = all points on the line

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in asdict(self).items()}


def rate(count: float, seconds: float) -> float | None:
    """count / seconds, or None when nothing was timed."""
    return round(count / seconds, 3) if seconds > 0 else None


def share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    """Ordinary least squares y = intercept + slope * x (needs two distinct x)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"linear_fit needs >= 2 aligned points, got {len(xs)} x and {len(ys)} y")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("linear_fit needs at least two distinct x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LinearFit(slope, intercept, r2)


def growth_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """log-log slope between the two largest x (None when a value is not positive)."""
    if len(xs) < 2:
        return None
    pts = sorted(zip(xs, ys, strict=True))[-2:]
    (x1, y1), (x2, y2) = pts
    if min(x1, x2, y1, y2) <= 0 or x1 == x2:
        return None
    return round(math.log(y2 / y1) / math.log(x2 / x1), 4)


def marginal_ratio(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """(cost per added x over the last interval) / (over the first interval); needs 3 points."""
    pts = sorted(zip(xs, ys, strict=True))
    if len(pts) < 3:
        return None
    (x0, y0), (x1, y1) = pts[0], pts[1]
    (xa, ya), (xb, yb) = pts[-2], pts[-1]
    first = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
    last = (yb - ya) / (xb - xa) if xb != xa else 0.0
    return round(last / first, 4) if first > 0 else None


def scaling_summary(xs: Sequence[float], ys: Sequence[float]) -> dict[str, Any]:
    """Per-item cost at each size plus the fit, for one stage (or the total) of the scale run."""
    out: dict[str, Any] = {
        "per_item": [round(y / x, 6) if x else None for x, y in zip(xs, ys, strict=True)],
        "growth_exponent": growth_exponent(xs, ys),
        "marginal_ratio": marginal_ratio(xs, ys),
    }
    if len(set(xs)) >= 2:
        out["fit"] = linear_fit(xs, ys).as_dict()
    return out
