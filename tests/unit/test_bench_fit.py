"""Numeric helpers of the bench harness: least-squares line, growth exponent, rates."""

from __future__ import annotations

import pytest

from structmem_gpu.bench.fit import (
    growth_exponent,
    linear_fit,
    marginal_ratio,
    rate,
    scaling_summary,
    share,
)


def test_linear_fit_recovers_a_line() -> None:
    fit = linear_fit([10, 100, 1000], [2 + 0.5 * x for x in (10, 100, 1000)])
    assert fit.slope == pytest.approx(0.5)
    assert fit.intercept == pytest.approx(2.0)
    assert fit.r2 == pytest.approx(1.0)


def test_linear_fit_r2_drops_for_a_curve() -> None:
    xs = [1, 2, 3, 4, 5]
    assert linear_fit(xs, [x**3 for x in xs]).r2 < 0.95


def test_linear_fit_rejects_degenerate_input() -> None:
    with pytest.raises(ValueError):
        linear_fit([1], [1])
    with pytest.raises(ValueError):
        linear_fit([3, 3], [1, 2])
    with pytest.raises(ValueError):
        linear_fit([1, 2], [1])


def test_growth_exponent_is_one_for_linear_and_two_for_quadratic() -> None:
    xs = [10, 100, 1000]
    # A fixed start-up cost fades at the large end.
    assert growth_exponent(xs, [1 + 0.1 * x for x in xs]) == pytest.approx(1.0, abs=0.05)
    assert growth_exponent(xs, [x * x for x in xs]) == pytest.approx(2.0)
    assert growth_exponent([10], [1]) is None
    assert growth_exponent([10, 100], [0, 1]) is None


def test_marginal_ratio() -> None:
    xs = [10, 100, 1000]
    assert marginal_ratio(xs, [3 + 0.2 * x for x in xs]) == pytest.approx(1.0)
    assert marginal_ratio(xs, [x * x for x in xs]) == pytest.approx(1100 / 110)
    assert marginal_ratio([1, 2], [1, 2]) is None


def test_rate_and_share_handle_zero_time() -> None:
    assert rate(10, 2.0) == 5.0
    assert rate(10, 0.0) is None
    assert share(1, 4) == 0.25
    assert share(1, 0) is None


def test_scaling_summary_per_item_cost() -> None:
    s = scaling_summary([10, 20], [1.0, 2.0])
    assert s["per_item"] == [0.1, 0.1]
    assert s["fit"]["slope"] == pytest.approx(0.1)
    assert s["marginal_ratio"] is None
