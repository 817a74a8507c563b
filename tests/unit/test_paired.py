"""analysis/paired.py and `jobs/report.py compare`'s paired section: the accuracy difference of a
run against the reference run on the same questions, its paired bootstrap 95% CI and McNemar's
exact p, overall and per category, checked against hand-computed values and against
scipy.stats.binomtest on the discordant pairs (scipy is a dependency of the base install)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from scipy.stats import binomtest

from jobs.report import main as report_main
from structmem_gpu.analysis.paired import (
    mcnemar_exact,
    paired_accuracy,
    paired_comparison,
    paired_diff,
)
from structmem_gpu.core.schemas import JUDGMENTS, frame

NAMES = {"1": "multi-hop", "2": "temporal"}


# ---- statistics -------------------------------------------------------------------------------
@pytest.mark.parametrize(("b", "c", "p"), [
    (0, 0, 1.0),            # no discordant pair: nothing to test
    (0, 5, 0.0625),         # 2 * 0.5**5
    (1, 4, 0.375),          # 2 * (C(5,0) + C(5,1)) / 2**5 = 2 * 6 / 32
    (3, 3, 1.0),            # 2 * P[X <= 3 | n=6] = 2 * 42/64 > 1 -> 1
    (2, 8, 0.109375),       # 2 * (1 + 10 + 45) / 1024
])
def test_mcnemar_hand_computed(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p, abs=1e-12)


def test_mcnemar_equals_scipy_binomtest_on_the_discordant_pairs() -> None:
    for b, c in itertools.chain(itertools.product(range(0, 13), repeat=2),
                                [(40, 61), (300, 270), (0, 1000)]):
        if b + c == 0:
            continue
        expected = binomtest(c, b + c, 0.5, alternative="two-sided").pvalue
        assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300), (b, c)


def test_paired_accuracy_hand_computed_with_unjudged_pairs_left_out() -> None:
    ref = [True, True, False, False, None, True, False]
    run = [True, False, True, True, True, None, False]
    out = paired_accuracy(ref, run, resamples=200, seed=0)
    # judged by both: (T,T) (T,F) (F,T) (F,T) (F,F) -> n 5, 2 pairs left out
    assert out["n"] == 5 and out["unjudged_pairs"] == 2
    assert out["acc_ref"] == pytest.approx(2 / 5) and out["acc_run"] == pytest.approx(3 / 5)
    assert out["diff"] == pytest.approx(1 / 5)
    assert (out["b_ref_only"], out["c_run_only"]) == (1, 2)
    assert out["mcnemar_p"] == pytest.approx(binomtest(2, 3, 0.5).pvalue) == 1.0
    assert out["ci_low"] <= out["diff"] <= out["ci_high"]


def test_paired_bootstrap_ci_equals_the_exact_bootstrap_distribution() -> None:
    # Differences (1, 0, 0, 0): a resample's mean is K/4 with K ~ Binomial(4, 1/4):
    # P(K=0..4) = .316, .422, .211, .047, .004, so the 2.5% quantile is 0 and the 97.5% is 3/4
    # (P(K <= 2) = .949 < .975 <= P(K <= 3) = .996). Enumerated, then by the resampler.
    d_ref, d_run = [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]
    means = sorted(np.mean(c) for c in itertools.product([1, 0, 0, 0], repeat=4))
    exact = (means[int(0.025 * len(means))], means[int(np.ceil(0.975 * len(means))) - 1])
    assert exact == (0.0, 0.75)
    diff, ci = paired_diff(d_ref, d_run, resamples=20_000, seed=3)
    assert diff == 0.25 and ci == exact
    # Every pair moves the same way: the interval is the point.
    assert paired_diff([0, 0, 1], [1, 1, 2], resamples=500)[1] == (1.0, 1.0)


def test_paired_ci_is_narrower_than_unpaired_when_outcomes_agree() -> None:
    rng = np.random.default_rng(1)
    ref = rng.random(400) < 0.6
    run = ref.copy()
    flip = rng.choice(400, 30, replace=False)
    run[flip[:20]] = True  # the run also gets 20 questions right that the reference missed
    run[flip[20:]] = False
    _, (lo, hi) = paired_diff(ref.astype(float), run.astype(float), resamples=2000)
    unpaired = 1.96 * np.sqrt(ref.var() / 400 + run.var() / 400)
    assert hi - lo < unpaired  # pairing removes the shared question difficulty


# ---- runs -------------------------------------------------------------------------------------
def write_run(root: Path, name: str, labels: dict[str, list[bool | None]],
              f1: list[float] | None = None, categories: list[int] | None = None,
              overrides: list[str] | None = None) -> Path:
    """A finished run directory: report.json, manifest.json, questions + judgments tables.
    `labels` maps judge name -> one label per question q0..q(n-1)."""
    run = root / name
    (run / "tables").mkdir(parents=True)
    (run / "report").mkdir()
    n = len(next(iter(labels.values())))
    cats = categories or [1 if i % 2 == 0 else 2 for i in range(n)]
    qids = [f"q{i}" for i in range(n)]
    pl.DataFrame({"question_id": qids, "category": cats},
                 schema={"question_id": pl.String, "category": pl.Int32}
                 ).write_parquet(run / "tables" / "questions.parquet")
    rows = []
    for judge, labs in labels.items():
        for i, lab in enumerate(labs):
            rows.append({"question_id": qids[i], "judge_model": f"model-{judge}",
                         "judge_name": judge, "prompt_version": "j/1", "label": lab,
                         "reply_raw": "", "f1_locomo": (f1 or [0.0] * n)[i],
                         "f1_mem0": 0.0, "bleu1": 0.0, "evidence_recall": None})
    frame(rows, JUDGMENTS).write_parquet(run / "tables" / "judgments.parquet")
    head = next(iter(labels))
    acc = float(np.mean([bool(x) for x in labels[head]]))
    group = {"n": n, "judge_accuracy": acc, "judge_accuracy_ci95": [0.0, 1.0]}
    report = {
        "benchmark": "sample", "method": "structmem", "judge": head, "unjudged": 0,
        "overall": {"name": "overall", **group},
        "by_category": {c: {"name": NAMES[c], **group} for c in NAMES},
        "category_names": NAMES, "category_scope": [1, 2],
        "settings": {"bootstrap_resamples": 1000, "bootstrap_seed": 0},
    }
    (run / "report" / "report.json").write_text(json.dumps(report))
    (run / "manifest.json").write_text(json.dumps({"method": "structmem", "benchmark": "sample",
                                                   "config_hash": name, "stages": {}}))
    if overrides:
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return run


T, F = True, False
# Ten questions, categories alternate 1, 2 (even index = multi-hop).
REF = [T, T, T, F, F, T, F, T, None, T]
RUN = [T, F, T, T, T, T, T, T, T, F]
F1_REF = [0.5, 0.2, 0.1, 0.0, 0.3, 0.4, 0.0, 0.9, 0.2, 0.6]
F1_RUN = [0.6, 0.2, 0.4, 0.5, 0.3, 0.4, 0.5, 0.9, 0.1, 0.2]


def _hand(ref: list[bool | None], run: list[bool | None], idx: list[int]) -> dict[str, Any]:
    pairs = [(ref[i], run[i]) for i in idx if ref[i] is not None and run[i] is not None]
    b = sum(1 for a, r in pairs if a and not r)
    c = sum(1 for a, r in pairs if r and not a)
    diff = (sum(r for _, r in pairs) - sum(a for a, _ in pairs)) / len(pairs)
    p = binomtest(c, b + c, 0.5).pvalue if b + c else 1.0
    return {"n": len(pairs), "diff": diff, "b": b, "c": c, "p": p}


def test_compare_prints_paired_difference_ci_and_mcnemar_per_category(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep"
    a = write_run(sweep, "seed_k=0", {"j": REF}, F1_REF, overrides=["consolidate.seed_k=0"])
    b = write_run(sweep, "seed_k=5", {"j": RUN}, F1_RUN, overrides=["consolidate.seed_k=5"])
    out = tmp_path / "cmp"
    assert report_main(["compare", str(out), str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert "## Paired against the reference" in printed and "Reference: seed_k=0" in printed
    data = json.loads((out / "paired.json").read_text())
    assert data["refused"] == []
    rows = {r["group"]: r for r in data["rows"]}
    assert set(rows) == {"overall", "1", "2"}
    groups = {"overall": list(range(10)), "1": [0, 2, 4, 6, 8], "2": [1, 3, 5, 7, 9]}
    for gid, idx in groups.items():
        hand, row = _hand(REF, RUN, idx), rows[gid]
        assert row["run_dir"] == str(b) and row["reference"] == str(a)
        assert row["n"] == hand["n"] and row["diff"] == pytest.approx(hand["diff"])
        assert (row["b_ref_only"], row["c_run_only"]) == (hand["b"], hand["c"])
        assert row["mcnemar_p"] == pytest.approx(hand["p"], rel=1e-12)
        assert row["ci_low"] <= row["diff"] <= row["ci_high"]
        d_lo, d_hi = paired_diff([float(bool(REF[i])) for i in idx if REF[i] is not None],
                                 [float(bool(RUN[i])) for i in idx if REF[i] is not None],
                                 resamples=1000, seed=0)[1]
        assert (row["ci_low"], row["ci_high"]) == (d_lo, d_hi)
        # the printed line: group name, n, difference in points, McNemar p
        name = {"overall": "overall", "1": "multi-hop", "2": "temporal"}[gid]
        line = next(x for x in printed.splitlines() if f"| {name} | {hand['n']} |" in x)
        assert f"{100 * hand['diff']:+.1f} [" in line and f"| {hand['b']} / {hand['c']} |" in line
        assert f"{hand['p']:.3g}" in line
    # Hand-computed overall: pairs 0-7 and 9 (q8 unjudged by the reference): ref 6/9, run 7/9,
    # b = 2 (q1, q9), c = 3 (q3, q4, q6), p = binomtest(3, 5) = 1.0.
    assert rows["overall"]["unjudged_pairs"] == 1
    assert (rows["overall"]["b_ref_only"], rows["overall"]["c_run_only"]) == (2, 3)
    assert rows["overall"]["diff"] == pytest.approx(1 / 9)
    # Lexical metrics: the paired bootstrap of per-question F1 differences over all 10 questions.
    assert rows["overall"]["f1_locomo_diff"] == pytest.approx(
        np.mean(np.array(F1_RUN) - np.array(F1_REF)))
    lo, hi = rows["overall"]["f1_locomo_ci_low"], rows["overall"]["f1_locomo_ci_high"]
    assert lo <= rows["overall"]["f1_locomo_diff"] <= hi
    assert (out / "paired.csv").read_text().startswith("run_dir,")


def test_runs_on_different_question_sets_are_refused_with_one_line(tmp_path: Path) -> None:
    a = write_run(tmp_path, "a", {"j": REF})
    b = write_run(tmp_path, "b", {"j": RUN[:8]})  # two questions fewer
    rows, refused = paired_comparison(a, [a, b])
    assert rows == [] and len(refused) == 1 and "\n" not in refused[0]
    assert "different question sets (8 vs 10 questions, 8 shared)" in refused[0]


def test_panels_are_paired_per_judge_never_across_judges(tmp_path: Path) -> None:
    # Judge x agrees between the runs; judge y flips every question. Pairing across judges
    # would mix them; per judge, x shows no difference and y shows every pair discordant.
    labs = [T, F, T, F, T, F]
    flip = [not x for x in labs]
    a = write_run(tmp_path, "a", {"x": labs, "y": labs})
    b = write_run(tmp_path, "b", {"x": labs, "y": flip})
    rows, refused = paired_comparison(a, [a, b])
    assert refused == []
    overall = {r["judge"]: r for r in rows if r["group"] == "overall"}
    assert set(overall) == {"x", "y"} and overall["x"]["headline"]
    assert (overall["x"]["b_ref_only"], overall["x"]["c_run_only"]) == (0, 0)
    assert overall["x"]["mcnemar_p"] == 1.0 and overall["x"]["diff"] == 0.0
    assert (overall["y"]["b_ref_only"], overall["y"]["c_run_only"]) == (3, 3)
    assert overall["y"]["n"] == 6 and overall["y"]["diff"] == 0.0
    assert "f1_locomo_diff" in overall["x"] and "f1_locomo_diff" not in overall["y"]


def test_runs_without_tables_are_named_not_paired(tmp_path: Path) -> None:
    a = write_run(tmp_path, "a", {"j": REF})
    b = write_run(tmp_path, "b", {"j": RUN})
    (b / "tables" / "judgments.parquet").unlink()
    rows, refused = paired_comparison(a, [a, b])
    assert rows == [] and len(refused) == 1 and "judgments.parquet" in refused[0]


def test_reference_option_takes_a_run_directory(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    write_run(sweep, "seed_k=0", {"j": REF}, overrides=["consolidate.seed_k=0"])
    b = write_run(sweep, "seed_k=5", {"j": RUN}, overrides=["consolidate.seed_k=5"])
    out = tmp_path / "cmp"
    assert report_main(["compare", str(out), str(sweep), "--reference", str(b)]) == 0
    rows = json.loads((out / "paired.json").read_text())["rows"]
    assert {r["reference"] for r in rows} == {str(b)}
    overall = next(r for r in rows if r["group"] == "overall")
    assert overall["diff"] == pytest.approx(-1 / 9)  # the same pairs, seen from the other side
    assert (overall["b_ref_only"], overall["c_run_only"]) == (3, 2)
    assert "Reference: seed_k=5" in (out / "comparison.md").read_text()
