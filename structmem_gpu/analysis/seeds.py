"""Build-seed replicates: the score's spread across builds, beside each build's question CI.

    python jobs/run.py -m experiment=structmem_locomo llm=vllm_qwen2_5_7b llm.seed=0,1,2
    python jobs/report.py compare outputs/compare/seeds <the multirun directory>

Extraction and synthesis sample (temperature 0.1, top_p 0.1, seeded by `llm.seed`, which every
request carries: llm/seeded.py), so two builds of one configuration differ. The question-level
bootstrap CI of one run holds the build fixed; the runs of a sweep over `llm.seed` measure the
build's own variance. `seed_groups` groups the rows of a compare_runs frame that differ only in
`llm.seed` and gives, per group with two or more seeds: the seeds, the mean ± sd (sample sd,
n - 1) of overall and per-category judge accuracy across the builds, each build's overall
score with its question-level 95% CI, and how many seeds per configuration a comparison needs.

Seeds needed: a comparison of two configurations with k builds each has, from the builds alone,
a difference standard error of sd * sqrt(2 / k); resolving a difference of d at 95% needs
1.96 * sd * sqrt(2 / k) <= d, i.e. k >= 2 * (1.96 * sd / d)^2 (at least 2, so that sd can be
estimated). The sd comes from the measured builds; with 3 builds it is itself uncertain (a
chi-square with 2 degrees of freedom: the true sd may be 6x larger at 95%), so treat k as a
lower bound and re-measure with the larger k.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

SEED_KEY = "llm.seed"
Z95 = 1.959963984540054
DIFFS_PP = (0.5, 1.0, 2.0)  # differences (points) the section gives the seeds needed for


def seeds_needed(sd: float, diff: float) -> int:
    """Builds per configuration so that build noise alone resolves `diff` at 95% (same units
    as `sd`): ceil(2 * (1.96 * sd / diff)^2), at least 2.

    >>> seeds_needed(0.5, 1.0)   # 2 * (0.98)^2 = 1.92
    2
    >>> seeds_needed(1.0, 0.5)   # 2 * 3.92^2 = 30.7
    31
    """
    if diff <= 0:
        raise ValueError(f"difference must be > 0, got {diff}")
    return max(2, math.ceil(2 * (Z95 * sd / diff) ** 2))


def _mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
    v = [float(x) for x in values if x is not None]
    if not v:
        return None, None
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else None)


def seed_groups(df: pl.DataFrame) -> list[dict[str, Any]]:
    """One dict per configuration run under two or more `llm.seed` values (see module doc);
    [] when the frame has no `llm.seed` column (no sweep over it)."""
    if SEED_KEY not in df.columns:
        return []
    labels = df.columns[: df.columns.index("method")]
    keys = [k for k in labels if k != SEED_KEY] + ["method", "benchmark", "judge", "answer_model"]
    keys = [k for k in dict.fromkeys(keys) if k in df.columns]
    acc = [c for c in df.columns if c.startswith("acc_") and not c.startswith("acc_overall")]
    out = []
    for _, g in df.group_by(keys, maintain_order=True):
        g = g.filter(pl.col(SEED_KEY).is_not_null()).sort(SEED_KEY)
        if g.height < 2:
            continue
        mean, sd = _mean_sd(g["acc_overall"].to_list())
        group: dict[str, Any] = {
            "config": {k: g[k][0] for k in keys},
            "seeds": g[SEED_KEY].to_list(),
            "k": g.height,
            "acc_overall_mean": mean,
            "acc_overall_sd": sd,
            "builds": [
                {"seed": r[SEED_KEY], "run_dir": r["run_dir"], "acc_overall": r["acc_overall"],
                 "ci95": [r["acc_overall_ci_low"], r["acc_overall_ci_high"]], "n": r["n"]}
                for r in g.iter_rows(named=True)
            ],
            "by_category": {
                c.removeprefix("acc_"): dict(zip(("mean", "sd"), _mean_sd(g[c].to_list()),
                                                 strict=True))
                for c in acc
            },
        }
        if sd is not None:
            group["seeds_needed"] = {
                f"{d:g}": seeds_needed(100 * sd, d) if sd > 0 else 2 for d in DIFFS_PP
            }
        out.append(group)
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _pm(mean: float | None, sd: float | None) -> str:
    return "–" if mean is None else f"{_pct(mean)} ± {_pct(sd) if sd is not None else '–'}"


def seeds_markdown(groups: Sequence[Mapping[str, Any]]) -> str:
    """The "Build-seed replicates" section of comparison.md and the sweep summary."""
    if not groups:
        return ""
    lines = ["## Build-seed replicates", "",
             "Configurations run under several `llm.seed` values (the build's sampling seed): "
             "judge accuracy in percent as mean ± sd across builds (sample sd), each build's "
             "overall score with its question-level 95% bootstrap CI, and the builds per "
             "configuration a comparison needs for build noise alone to resolve a difference "
             "of d points at 95%: k >= 2 (1.96 sd / d)^2 (docs/evaluation.md \"Build-seed "
             "replicates\").", ""]
    cats = list(dict.fromkeys(c for g in groups for c in g["by_category"]))
    head = ["configuration", "seeds", "overall mean ± sd", *cats, "each build (95% CI)",
            *(f"seeds for {d:g} pt" for d in DIFFS_PP)]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        config = ", ".join(f"{k}={v}" for k, v in g["config"].items() if v is not None)
        builds = "; ".join(
            f"seed {b['seed']}: {_pct(b['acc_overall'])} [{_pct(b['ci95'][0])}, "
            f"{_pct(b['ci95'][1])}]" for b in g["builds"])
        need = g.get("seeds_needed") or {}
        cells = [config, ", ".join(str(s) for s in g["seeds"]),
                 _pm(g["acc_overall_mean"], g["acc_overall_sd"]),
                 *(_pm(*(g["by_category"].get(c, {}).get(k) for k in ("mean", "sd")))
                   for c in cats),
                 builds, *(str(need.get(f"{d:g}", "–")) for d in DIFFS_PP)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
