"""Intervals that respect LoCoMo's design (issue 44, part 4): the cluster bootstrap resamples
whole conversations, the minimum detectable difference follows McNemar's power formula, and
every reported interval names its resampling unit."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import polars as pl
import pytest

from structmem_gpu.eval.bootstrap import (
    bootstrap_ci,
    cluster_bootstrap_ci,
    cluster_bootstrap_means,
    min_detectable_difference,
)


def test_cluster_means_follow_the_hand_enumerated_distribution() -> None:
    # Two conversations, A = [1] and B = [0, 0, 0]. Drawing two with replacement: AA (1/4)
    # -> 1/1; AB or BA (1/2) -> 1/4 (one right of four questions); BB (1/4) -> 0.
    means = cluster_bootstrap_means([1, 0, 0, 0], ["A", "B", "B", "B"], resamples=40_000, seed=3)
    freq = {v: float(np.mean(np.isclose(means, v))) for v in (1.0, 0.25, 0.0)}
    assert sum(freq.values()) == pytest.approx(1.0)
    assert freq[1.0] == pytest.approx(0.25, abs=0.01)
    assert freq[0.25] == pytest.approx(0.5, abs=0.01)
    assert freq[0.0] == pytest.approx(0.25, abs=0.01)


def test_perfectly_correlated_conversations_widen_the_interval() -> None:
    # 10 conversations of 20 questions, each answered all right or all wrong: the questions
    # carry the information of 10 draws, not 200.
    values = [float(c % 2) for c in range(10) for _ in range(20)]
    convs = [f"conv-{c}" for c in range(10) for _ in range(20)]
    q_lo, q_hi = bootstrap_ci(values, resamples=2000, seed=0)
    c_lo, c_hi = cluster_bootstrap_ci(values, convs, resamples=2000, seed=0)
    assert (c_hi - c_lo) > 2.5 * (q_hi - q_lo)
    # One question per conversation (LongMemEval: each question its own haystack): the two
    # coincide, draw for draw (labels sort in the values' order here).
    assert cluster_bootstrap_ci(values[::20], convs[::20], resamples=500, seed=1) == \
        bootstrap_ci(values[::20], resamples=500, seed=1)
    assert cluster_bootstrap_ci([], [], resamples=10) is None


@pytest.mark.parametrize(("n", "psi"), [(1540, 0.2), (150, 0.3), (60, 0.5), (5000, 0.05)])
def test_minimum_detectable_difference_solves_connors_formula(n: int, psi: float) -> None:
    d = min_detectable_difference(n, psi)
    assert d is not None and 0 < d <= psi**0.5
    z_a, z_b = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.8)
    needed = (z_a * psi**0.5 + z_b * (psi - d * d) ** 0.5) ** 2 / (d * d)
    assert needed == pytest.approx(n, rel=1e-6)
    assert min_detectable_difference(4 * n, psi) < d  # more questions, smaller detectable gap


def test_minimum_detectable_difference_edges() -> None:
    assert min_detectable_difference(0, 0.3) is None
    assert min_detectable_difference(100, 0.0) is None  # no pair can differ
    assert min_detectable_difference(3, 0.01) is None  # nothing these pairs allow is detectable


def test_report_groups_name_their_units_and_carry_the_cluster_interval() -> None:
    from structmem_gpu.eval.report import ReportSettings, group_summary
    from tests.fixtures.pipeline import job_with

    st = job_with().settings(ReportSettings)
    rows = pl.DataFrame({
        "label": [bool(c % 2) for c in range(10) for _ in range(20)],
        "conv_id": [f"conv-{c}" for c in range(10) for _ in range(20)],
        **{m: [0.5] * 200 for m in ("f1_locomo", "f1_mem0", "bleu1", "evidence_recall")},
    })
    g = group_summary(rows, "overall", st)
    assert g["judge_accuracy_ci95_unit"] == "questions" and g["conversations"] == 10
    q_lo, q_hi = g["judge_accuracy_ci95"]
    c_lo, c_hi = g["judge_accuracy_ci95_conversations"]
    assert c_hi - c_lo > 2.5 * (q_hi - q_lo)
    assert g["mde_paired"] == pytest.approx(min_detectable_difference(200, 2 * 0.5 * 0.5))


def test_paired_rows_give_the_conversation_interval_and_whether_the_gap_clears_the_mde() -> None:
    from structmem_gpu.analysis.paired import paired_accuracy

    ref = [True] * 100 + [False] * 100
    run = [True] * 100 + [True] * 40 + [False] * 60  # 40 more right, none lost
    convs = [f"c{i % 10}" for i in range(200)]
    row = paired_accuracy(ref, run, resamples=500, seed=0, clusters=convs)
    assert row["ci_unit"] == "questions" and row["conversations"] == 10
    assert row["ci_low_conv"] is not None and row["ci_low_conv"] <= row["diff"] <= row["ci_high_conv"]
    assert row["mde"] == pytest.approx(min_detectable_difference(200, 40 / 200))
    assert row["clears_mde"] is True
    tiny = paired_accuracy([True, False] * 50, [True, False] * 49 + [True, True], resamples=200)
    assert tiny["clears_mde"] is False and tiny["ci_low_conv"] is None
