"""Judge agreement: Cohen's kappa per judge pair, Fleiss' kappa over the whole panel.

    python jobs/report.py agreement outputs/runs/locomo/structmem     # after judge=panel_example
    # or, from code:
    table = judge_agreement(pl.read_parquet("RUN/tables/judgments.parquet"))
    print(agreement_markdown(table))

Reads judgments rows with several `judge_name` values (one row per question and judge, as the
judge stage writes them with `judge.panel`). Rows decided by a rule without an LLM call
(`judge_model` "rule:...", e.g. LoCoMo category 5) are left out: every judge gets the same
verdict there, which would inflate agreement. Unjudged rows (label null) are left out of every
pair and of Fleiss' kappa. One pair row:

    {"judge_a": "same_as_llm", "judge_b": "qwen2_5_32b", "n": 1540, "agreement": 0.91,
     "cohen_kappa": 0.78, "positive_rate_a": 0.62, "positive_rate_b": 0.58}

Kappa is undefined (NaN) when the chance agreement is 1, i.e. both judges gave one single
label to every item: there is nothing to agree on beyond chance.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import atomic_write_text


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Cohen's kappa of two raters' labels of the same items (any hashable categories).

    kappa = (p_o - p_e) / (1 - p_e), p_o = share of items with equal labels,
    p_e = sum over categories of p_a(c) * p_b(c). NaN when p_e == 1 (or no items).
    """
    if len(a) != len(b):
        raise ValueError(
            f"cohen_kappa needs two label lists of equal length, got {len(a)} and {len(b)}"
        )
    n = len(a)
    if n == 0:
        return math.nan
    p_o = sum(x == y for x, y in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[c] * cb[c] for c in ca.keys() | cb.keys()) / (n * n)
    if math.isclose(p_e, 1.0):
        return math.nan
    return (p_o - p_e) / (1 - p_e)


def fleiss_kappa(matrix: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa of an items x categories matrix of rater counts.

    matrix[i][j] = how many raters put item i into category j; every row must sum to the same
    number of raters n >= 2. P_i = (sum_j m_ij^2 - n) / (n (n - 1)), P_bar = mean P_i,
    p_j = column share, P_e = sum_j p_j^2, kappa = (P_bar - P_e) / (1 - P_e). NaN when P_e == 1.
    """
    rows = [list(map(int, r)) for r in matrix]
    if not rows:
        return math.nan
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise ValueError(f"fleiss_kappa needs rows of equal length, got lengths {sorted(width)}")
    raters = {sum(r) for r in rows}
    if len(raters) != 1:
        raise ValueError(
            f"fleiss_kappa needs the same number of raters per item, got {sorted(raters)}"
        )
    n = raters.pop()
    if n < 2:
        raise ValueError(f"fleiss_kappa needs at least 2 raters per item, got {n}")
    items = len(rows)
    p_bar = sum((sum(m * m for m in r) - n) / (n * (n - 1)) for r in rows) / items
    cols = [sum(r[j] for r in rows) / (items * n) for j in range(len(rows[0]))]
    p_e = sum(p * p for p in cols)
    if math.isclose(p_e, 1.0):
        return math.nan
    return (p_bar - p_e) / (1 - p_e)


@dataclass(frozen=True)
class PairAgreement:
    judge_a: str
    judge_b: str
    n: int  # items both judges labelled (rule verdicts and unjudged rows excluded)
    agreement: float | None  # observed share of equal labels
    cohen_kappa: float | None
    positive_rate_a: float | None
    positive_rate_b: float | None


@dataclass(frozen=True)
class AgreementTable:
    judges: list[str]
    pairs: list[PairAgreement] = field(default_factory=list)
    fleiss_n: int = 0  # items labelled by every judge
    fleiss_kappa: float | None = None
    excluded_rule_items: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "judges": self.judges,
            "pairs": [asdict(p) for p in self.pairs],
            "fleiss_n": self.fleiss_n,
            "fleiss_kappa": self.fleiss_kappa,
            "excluded_rule_items": self.excluded_rule_items,
        }


def _finite(x: float) -> float | None:
    """NaN (undefined) as None, so JSON and tables show it as missing rather than a number."""
    return None if math.isnan(x) else round(x, 4)


def label_matrix(judgments: pl.DataFrame) -> tuple[pl.DataFrame, list[str], int]:
    """(question_id x judge_name label frame, judges in first-seen order, rule items left out)."""
    needed = {"question_id", "judge_name", "judge_model", "label"}
    missing = needed - set(judgments.columns)
    if missing:
        raise ValueError(f"judgments table lacks columns {sorted(missing)}")
    judges = list(dict.fromkeys(judgments["judge_name"].to_list()))
    rule_q = judgments.filter(pl.col("judge_model").str.starts_with("rule:"))[
        "question_id"
    ].unique()
    asked = judgments.filter(~pl.col("question_id").is_in(rule_q.implode()))
    wide = asked.pivot(
        on="judge_name", index="question_id", values="label", aggregate_function="first"
    )
    return wide.sort("question_id"), judges, rule_q.len()


def judge_agreement(judgments: pl.DataFrame) -> AgreementTable:
    """Pairwise Cohen's kappa and the panel's Fleiss' kappa from a judgments table."""
    wide, judges, excluded = label_matrix(judgments)
    pairs = []
    for ja, jb in itertools.combinations(judges, 2):
        both = wide.select(ja, jb).drop_nulls()
        a, b = both[ja].to_list(), both[jb].to_list()
        n = len(a)
        pairs.append(
            PairAgreement(
                judge_a=ja,
                judge_b=jb,
                n=n,
                agreement=round(sum(x == y for x, y in zip(a, b)) / n, 4) if n else None,
                cohen_kappa=_finite(cohen_kappa(a, b)),
                positive_rate_a=round(sum(map(bool, a)) / n, 4) if n else None,
                positive_rate_b=round(sum(map(bool, b)) / n, 4) if n else None,
            )
        )
    fleiss, fleiss_n = None, 0
    if len(judges) >= 2:
        full = wide.select(judges).drop_nulls()
        fleiss_n = full.height
        counts = [[sum(bool(v) for v in row), sum(not v for v in row)] for row in full.iter_rows()]
        fleiss = _finite(fleiss_kappa(counts)) if counts else None
    return AgreementTable(judges, pairs, fleiss_n, fleiss, excluded)


def _fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def agreement_markdown(table: AgreementTable, title: str = "Judge agreement") -> str:
    lines = [
        f"# {title}",
        "",
        (
            f"Judges: {', '.join(table.judges)}. Rule-decided questions left out: "
            f"{table.excluded_rule_items}. Unjudged rows are left out of each pair."
        ),
        "",
        "| judge A | judge B | n | agreement | Cohen's kappa | positive A | positive B |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in table.pairs:
        lines.append(
            f"| {p.judge_a} | {p.judge_b} | {p.n} | {_fmt(p.agreement)} | "
            f"{_fmt(p.cohen_kappa)} | {_fmt(p.positive_rate_a)} | {_fmt(p.positive_rate_b)} |"
        )
    lines += [
        "",
        (
            f"Fleiss' kappa over all {len(table.judges)} judges: "
            f"{_fmt(table.fleiss_kappa)} (n = {table.fleiss_n} questions labelled by "
            f"every judge)"
        ),
        "",
    ]
    return "\n".join(lines)


def write_agreement(table: AgreementTable, out_dir: Path) -> dict[str, Path]:
    """agreement.md and agreement.json under `out_dir` (atomic writes)."""
    paths = {"md": out_dir / "agreement.md", "json": out_dir / "agreement.json"}
    atomic_write_text(paths["md"], agreement_markdown(table))
    atomic_write_text(paths["json"], json.dumps(table.as_dict(), indent=2) + "\n")
    return paths
