"""Judge agreement (structmem_gpu/eval/agreement.py) on hand-computed examples."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from jobs.report import main as report_main
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.eval.agreement import cohen_kappa, fleiss_kappa, judge_agreement
from structmem_gpu.core.schemas import JUDGMENTS, conform


def test_cohen_kappa_textbook_example() -> None:
    # 50 items: yes/yes 20, yes/no 5, no/yes 10, no/no 15.
    # p_o = 35/50 = 0.7; p_yes(A) = 0.5, p_yes(B) = 0.6; p_e = 0.5*0.6 + 0.5*0.4 = 0.5
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    a = ["y"] * 20 + ["y"] * 5 + ["n"] * 10 + ["n"] * 15
    b = ["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)


def test_cohen_kappa_small_by_hand() -> None:
    # a = TTFF, b = TFFF: p_o = 3/4; p_e = (2/4)(1/4) + (2/4)(3/4) = 1/2; kappa = 0.25/0.5 = 0.5
    assert cohen_kappa([True, True, False, False], [True, False, False, False]) == pytest.approx(
        0.5
    )
    assert cohen_kappa([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    # Systematic disagreement: p_o = 0, p_e = 0.5 -> -1.
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)


def test_cohen_kappa_undefined_and_errors() -> None:
    assert math.isnan(cohen_kappa([True] * 3, [True] * 3))  # p_e = 1
    assert math.isnan(cohen_kappa([], []))
    with pytest.raises(ValueError, match="equal length"):
        cohen_kappa([1], [1, 2])


def test_fleiss_kappa_textbook_example() -> None:
    # Fleiss (1971) / Wikipedia: 10 items, 14 raters, 5 categories -> P_bar 0.378, P_e 0.213,
    # kappa 0.210.
    m = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(m) == pytest.approx(0.2099, abs=5e-4)


def test_fleiss_kappa_small_by_hand() -> None:
    # 2 raters, 4 items: P_i = 1, 1, 0, 1 -> P_bar = 0.75; p = (5/8, 3/8) -> P_e = 34/64;
    # kappa = (0.75 - 0.53125) / 0.46875 = 0.4667
    assert fleiss_kappa([[2, 0], [0, 2], [1, 1], [2, 0]]) == pytest.approx(0.21875 / 0.46875)
    # With two raters and two categories Fleiss' kappa is Scott's pi, close to Cohen's kappa.
    assert fleiss_kappa([[2, 0], [2, 0], [0, 2], [0, 2]]) == pytest.approx(1.0)


def test_fleiss_kappa_errors() -> None:
    with pytest.raises(ValueError, match="same number of raters"):
        fleiss_kappa([[2, 0], [1, 0]])
    with pytest.raises(ValueError, match="at least 2 raters"):
        fleiss_kappa([[1, 0], [0, 1]])
    assert math.isnan(fleiss_kappa([[3, 0], [3, 0]]))


def _judgments(labels: dict[str, list[bool | None]], rule_q: str | None = None) -> pl.DataFrame:
    rows = []
    for judge, labs in labels.items():
        for i, lab in enumerate(labs):
            qid = f"q{i}"
            rows.append(
                {
                    "question_id": qid,
                    "judge_name": judge,
                    "label": lab,
                    "judge_model": "rule:locomo-cat5" if qid == rule_q else f"m-{judge}",
                    "prompt_version": "judge/1",
                    "reply_raw": None,
                    "f1_locomo": 0.0,
                    "f1_mem0": 0.0,
                    "bleu1": 0.0,
                    "evidence_recall": None,
                }
            )
    return conform(pl.DataFrame(rows), JUDGMENTS)


def test_judge_agreement_table() -> None:
    df = _judgments(
        {
            "a": [True, True, False, False, True, None],
            "b": [True, False, False, False, True, True],
            "c": [True, True, False, True, True, True],
        },
        rule_q="q4",
    )  # q4 decided by rule for everybody: left out
    t = judge_agreement(df)
    assert t.judges == ["a", "b", "c"] and t.excluded_rule_items == 1
    ab = next(p for p in t.pairs if (p.judge_a, p.judge_b) == ("a", "b"))
    # q0..q3 (q5 unjudged by a): a = TTFF, b = TFFF -> kappa 0.5 (see above)
    assert (ab.n, ab.agreement, ab.cohen_kappa) == (4, 0.75, 0.5)
    bc = next(p for p in t.pairs if (p.judge_a, p.judge_b) == ("b", "c"))
    assert bc.n == 5  # q0..q3 and q5
    assert t.fleiss_n == 4
    # Fleiss over q0..q3 with 3 raters: counts (T,F) = (3,0) (2,1) (0,3) (1,2)
    expected = fleiss_kappa([[3, 0], [2, 1], [0, 3], [1, 2]])
    assert t.fleiss_kappa == pytest.approx(round(expected, 4))


def test_agreement_cli_writes_the_kappa_table(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path / "run")
    run.write_table(
        "judgments", _judgments({"a": [True, True, False, False], "b": [True, False, False, False]})
    )
    assert report_main(["agreement", str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "| a | b | 4 | 0.750 | 0.500 |" in out
    data = json.loads((run.report_dir / "agreement.json").read_text())
    assert data["pairs"][0]["cohen_kappa"] == 0.5 and data["fleiss_n"] == 4


def test_agreement_cli_needs_several_judges(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path / "run")
    run.write_table("judgments", _judgments({"a": [True, False]}))
    assert report_main(["agreement", str(run.root)]) == 2
    assert "needs several" in capsys.readouterr().err
