"""Paired comparisons of runs on the same questions: is a difference real?

    pairs = paired_comparison(reference_run_dir, [other_run_dir, ...])   # list of dict rows
    paired_markdown(pairs)        # the "Paired against the reference" section of comparison.md

Two runs of one benchmark answer the same questions, so their per-question outcomes are paired.
For each run against the reference run, over the questions both judged (a pair where either
side's label is null is left out and counted in `unjudged_pairs`), overall and per category:

- `diff` = accuracy(run) - accuracy(reference) on those pairs, with a paired bootstrap 95% CI:
  the percentile interval of the mean of the per-question differences, resampling questions
  (the same seeded resampler as the per-run CI, eval/bootstrap.py; resamples and seed are the
  reference report's `settings`);
- McNemar's exact test: `b` = pairs the reference got right and the run wrong, `c` = the
  reverse; under "no difference" the c of the b + c discordant pairs is Binomial(b + c, 1/2),
  and p = min(1, 2 * P[X <= min(b, c)]) (two-sided; p = 1 when there is no discordant pair).

A panel run (several judges) is paired per judge: the reference's labels by judge J against
the run's labels by judge J, never across judges; the headline judge (the reference report's
`judge`) comes first. Lexical metrics (LoCoMo F1, mem0's F1, BLEU-1) do not depend on a judge
and get the paired bootstrap of their per-question differences, on the headline judge's rows.

Runs are paired only on the same question set (the question ids the report scored: the
questions table within the report's `category_scope`); a run on another set is refused with
one line (`refused`), never paired on the overlap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.errors import InputError
from structmem_gpu.eval.bootstrap import bootstrap_ci, cluster_bootstrap_ci, min_detectable_difference

LEXICAL = ("f1_locomo", "f1_mem0", "bleu1")
DEFAULT_RESAMPLES, DEFAULT_SEED = 1000, 0


# ---- statistics -------------------------------------------------------------------------------
def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (binomial test, p = 1/2).

    >>> mcnemar_exact(0, 5)   # 2 * 0.5**5
    0.0625
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    # Exact integer arithmetic: P[X <= k] = sum C(n, i) / 2^n, no float underflow for large n.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_diff(
    ref: Sequence[float], run: Sequence[float], *, resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float | None, tuple[float, float] | None]:
    """(mean of run - ref, paired bootstrap 95% CI of it) over aligned per-question values."""
    if len(ref) != len(run):
        raise ValueError(f"paired values of different lengths: {len(ref)} vs {len(run)}")
    d = [float(b) - float(a) for a, b in zip(ref, run, strict=True)]
    if not d:
        return None, None
    return sum(d) / len(d), bootstrap_ci(d, resamples=resamples, seed=seed)


def paired_accuracy(
    ref: Sequence[bool | None], run: Sequence[bool | None], *,
    resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
    clusters: Sequence[object] | None = None,
) -> dict[str, Any]:
    """Paired judge accuracy of two label lists aligned by question (None = unjudged).
    `clusters` (each question's conversation) adds the cluster bootstrap interval of the
    difference, resampling whole conversations (`ci_low_conv`, `ci_high_conv`)."""
    keep = [i for i, (a, b) in enumerate(zip(ref, run, strict=True)) if a is not None and b is not None]
    both = [(bool(ref[i]), bool(run[i])) for i in keep]
    a = [float(x) for x, _ in both]
    r = [float(y) for _, y in both]
    diff, ci = paired_diff(a, r, resamples=resamples, seed=seed)
    b_count = sum(1 for x, y in both if x and not y)
    c_count = sum(1 for x, y in both if y and not x)
    n = len(both)
    conv = None if clusters is None or not n else cluster_bootstrap_ci(
        [y - x for x, y in zip(a, r, strict=True)], [clusters[i] for i in keep],
        resamples=resamples, seed=seed)
    # The smallest difference these pairs could show at alpha 0.05 / power 0.8 (McNemar, the
    # observed discordant share); whether the observed one clears it.
    mde = min_detectable_difference(n, (b_count + c_count) / n) if n else None
    return {
        "n": n,
        "unjudged_pairs": len(ref) - n,
        "acc_ref": sum(a) / n if n else None,
        "acc_run": sum(r) / n if n else None,
        "diff": diff,
        "ci_low": ci[0] if ci else None,
        "ci_high": ci[1] if ci else None,
        "ci_unit": "questions",
        "ci_low_conv": conv[0] if conv else None,
        "ci_high_conv": conv[1] if conv else None,
        "conversations": None if clusters is None else len({clusters[i] for i in keep}),
        "b_ref_only": b_count,
        "c_run_only": c_count,
        "mcnemar_p": mcnemar_exact(b_count, c_count),
        "mde": mde,
        "clears_mde": None if mde is None or diff is None else abs(diff) >= mde,
    }


# ---- runs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoredRun:
    """What pairing needs of one finished run: its report and its scored judgment rows."""

    root: Path
    report: Mapping[str, Any]
    rows: pl.DataFrame  # question_id, category, judge_name, judge_model, label, lexical metrics

    @property
    def questions(self) -> frozenset[str]:
        return frozenset(self.rows["question_id"].unique().to_list())

    @property
    def judges(self) -> list[str]:
        head = self.report.get("judge")
        names = list(dict.fromkeys(self.rows["judge_name"].drop_nulls().to_list()))
        return sorted(names, key=lambda j: (j != head, names.index(j)))


def load_scored(run_dir: Path) -> ScoredRun:
    """The report's scored rows of a run directory: judgments joined with the questions inside
    the report's category scope (what report.json's scores were computed on)."""
    run_dir = Path(run_dir)
    report_path = run_dir / "report" / "report.json"
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(report_path, f"unreadable report ({exc})") from exc
    tables = run_dir / "tables"
    for name in ("questions", "judgments"):
        if not (tables / f"{name}.parquet").is_file():
            raise InputError(tables / f"{name}.parquet", "missing; pairing needs the run's "
                             "per-question tables")
    questions = pl.read_parquet(tables / "questions.parquet")
    questions = questions.select([c for c in ("question_id", "conv_id", "category") if c in questions.columns])
    scope = report.get("category_scope") or report.get("categories")
    if scope:
        questions = questions.filter(pl.col("category").is_in([int(c) for c in scope]))
    judgments = pl.read_parquet(tables / "judgments.parquet")
    keep = ["question_id", "judge_name", "judge_model", "label", *LEXICAL]
    rows = judgments.select([c for c in keep if c in judgments.columns]).join(
        questions, on="question_id", how="inner")
    return ScoredRun(run_dir, report, rows)


def same_questions(ref: ScoredRun, run: ScoredRun) -> str | None:
    """None when both runs scored the same question set, else the one line refusing them."""
    a, b = ref.questions, run.questions
    if a == b:
        return None
    return (f"{run.root}: not paired with {ref.root}: different question sets "
            f"({len(b)} vs {len(a)} questions, {len(a & b)} shared)")


def _group_rows(
    ref: pl.DataFrame, run: pl.DataFrame, names: Mapping[str, str], resamples: int, seed: int,
    lexical: bool,
) -> list[dict[str, Any]]:
    """Overall + per-category paired rows of one judge's rows of two runs."""
    joined = ref.join(run, on="question_id", how="inner", suffix="_run").sort("question_id")
    groups: list[tuple[str, str, pl.DataFrame]] = [("overall", "overall", joined)]
    for cat in sorted(joined["category"].unique().to_list()):
        groups.append((str(cat), names.get(str(cat), str(cat)),
                       joined.filter(pl.col("category") == cat)))
    out = []
    for gid, gname, g in groups:
        clusters = g["conv_id"].to_list() if "conv_id" in g.columns else None
        row = {"group": gid, "group_name": gname,
               **paired_accuracy(g["label"].to_list(), g["label_run"].to_list(),
                                 resamples=resamples, seed=seed, clusters=clusters)}
        if lexical:
            for m in LEXICAL:
                if m not in g.columns or f"{m}_run" not in g.columns:
                    continue
                both = g.filter(pl.col(m).is_not_null() & pl.col(f"{m}_run").is_not_null())
                diff, ci = paired_diff(both[m].to_list(), both[f"{m}_run"].to_list(),
                                       resamples=resamples, seed=seed)
                row[f"{m}_diff"] = diff
                row[f"{m}_ci_low"], row[f"{m}_ci_high"] = ci if ci else (None, None)
        out.append(row)
    return out


def pair_runs(ref: ScoredRun, run: ScoredRun) -> list[dict[str, Any]]:
    """Paired rows of `run` against `ref`: per shared judge (headline first), overall then per
    category. Raises nothing for a different question set: check `same_questions` first."""
    settings = ref.report.get("settings") or {}
    resamples = int(settings.get("bootstrap_resamples") or DEFAULT_RESAMPLES)
    seed = int(settings.get("bootstrap_seed") or DEFAULT_SEED)
    names = {str(k): str(v) for k, v in (ref.report.get("category_names") or {}).items()}
    head = ref.report.get("judge")
    out = []
    shared = [j for j in ref.judges if j in run.judges]
    for judge in shared:
        a = ref.rows.filter(pl.col("judge_name") == judge)
        b = run.rows.filter(pl.col("judge_name") == judge)
        models_a = sorted(set(a["judge_model"].drop_nulls().to_list()))
        models_b = sorted(set(b["judge_model"].drop_nulls().to_list()))
        b = b.select([c for c in b.columns if c not in ("category", "conv_id")])
        for row in _group_rows(a, b, names, resamples, seed, lexical=judge == shared[0]):
            out.append({"run_dir": str(run.root), "reference": str(ref.root), "judge": judge,
                        "headline": judge == head, "judge_models_differ": models_a != models_b,
                        "resamples": resamples, "seed": seed, **row})
    return out


def paired_comparison(
    reference: Path, runs: Sequence[Path]
) -> tuple[list[dict[str, Any]], list[str]]:
    """(paired rows of every run against `reference`, one refusal line per run not paired)."""
    rows: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        ref = load_scored(reference)
    except InputError as err:  # e.g. a run copied without its tables: nothing to pair with
        return rows, [f"no paired tests against the reference: {err}"]
    for path in runs:
        if Path(path) == Path(reference):
            continue
        try:
            run = load_scored(path)
        except InputError as err:
            refused.append(f"{path}: not paired: {err}")
            continue
        line = same_questions(ref, run)
        if line is None and not [j for j in ref.judges if j in run.judges]:
            line = (f"{run.root}: not paired with {ref.root}: no judge in common "
                    f"({', '.join(run.judges) or 'none'} vs {', '.join(ref.judges) or 'none'})")
        if line is not None:
            refused.append(line)
            continue
        rows.extend(pair_runs(ref, run))
    return rows, refused


# ---- output -----------------------------------------------------------------------------------
def _pp(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def _interval(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{_pp(lo)}, {_pp(hi)}]"


def _mde(mde: float | None, clears: bool | None) -> str:
    return "–" if mde is None else f"{100 * mde:.1f}" + ("*" if clears else "")


def _p(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if x >= 0.001 else f"{x:.1e}"


def paired_markdown(
    rows: Sequence[Mapping[str, Any]], refused: Sequence[str], labels: Mapping[str, str],
    reference_label: str,
) -> str:
    """The "Paired against the reference" section: one line per (run, judge, group)."""
    lines = ["## Paired against the reference", "",
             f"Reference: {reference_label}. Each run against it on the questions both judged "
             "(unjudged pairs left out and counted), per judge: accuracy difference in points "
             "(run − reference) with its paired bootstrap 95% CI, McNemar's exact p over the "
             "discordant pairs (b: only the reference right, c: only the run right); lexical "
             "metrics: paired bootstrap of the per-question difference (headline judge's rows). "
             "`by conversation`: the same difference's interval resampling whole conversations "
             "(with LoCoMo's 10 it covers less than 95%); `MDE`: the smallest difference these "
             "pairs detect (McNemar, alpha 0.05, power 0.8, their discordant share), marked * "
             "when the observed difference clears it (docs/evaluation.md \"Intervals\").",
             ""]
    if rows:
        head = ["run", "judge", "group", "n", "unjudged pairs", "reference", "run acc",
                "diff (95% CI, questions)", "by conversation", "MDE", "b / c", "McNemar p",
                "F1 diff (95% CI)", "BLEU-1 diff (95% CI)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            def ci(prefix: str) -> str:
                d = r.get(f"{prefix}diff")
                if d is None:
                    return "–"
                lo, hi = r.get(f"{prefix}ci_low"), r.get(f"{prefix}ci_high")
                return f"{_pp(d)} [{_pp(lo)}, {_pp(hi)}]"

            judge = str(r["judge"]) + (" (models differ)" if r.get("judge_models_differ") else "")
            acc_ref = "–" if r["acc_ref"] is None else f"{100 * r['acc_ref']:.1f}"
            acc_run = "–" if r["acc_run"] is None else f"{100 * r['acc_run']:.1f}"
            cells = [labels.get(r["run_dir"], r["run_dir"]), judge, str(r["group_name"]),
                     str(r["n"]), str(r["unjudged_pairs"]), acc_ref, acc_run, ci(""),
                     _interval(r.get("ci_low_conv"), r.get("ci_high_conv")),
                     _mde(r.get("mde"), r.get("clears_mde")),
                     f"{r['b_ref_only']} / {r['c_run_only']}", _p(r["mcnemar_p"]),
                     ci("f1_locomo_"), ci("bleu1_")]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    else:
        lines.append("No run paired with the reference.")
    for line in refused:
        lines += ["", f"- refused: {line}"]
    return "\n".join(lines) + "\n"
