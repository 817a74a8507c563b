"""Fidelity-audit summaries for the report: rates, judge agreement and the report section.

    python jobs/run.py benchmark=sample method=structmem \
        stages=[audit_extraction,audit_consolidation,report] audit.extraction.sample_size=20
    # or the full Table 6/7 experiment: python jobs/run.py -m experiment=fidelity ...

The audit stages (StructMem paper Appendix A.6) live with StructMem in
methods/structmem/audit_extraction.py (Table 6: share of extracted entries a judge finds
unsupported by their source turn) and methods/structmem/audit_consolidation.py (Table 7: share
of the cross-event links a synthesis adds over its buffer-only twin that a judge finds
spurious), their shared settings in methods/structmem/audit.py. This module reads only their
tables: the rate statistics with bootstrap intervals, judge agreement, and
`audit_summary(run_dir)` / `audit_markdown(summary)` that the stages use to write
report/audit.json + report/audit.md and the report stage uses for its own report.md section.
A row with `label`/`judged` null is unjudged: recorded, left out of every rate, counted in
`unjudged`, never counted as supported or grounded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.eval.agreement import judge_agreement
from structmem_gpu.eval.bootstrap import bootstrap_ci

log = logging.getLogger(__name__)

EXTRACTION_TABLE = "audit_extraction"
CONSOLIDATION_TABLE = "audit_consolidation"


# ---- statistics -------------------------------------------------------------------------------
def rate_stats(
    flags: Sequence[bool], unjudged: int, *, resamples: int, seed: int
) -> dict[str, Any]:
    """{n, positive, rate, ci95, unjudged} of 0/1 flags (1 = the failure being measured)."""
    n, k = len(flags), int(sum(flags))
    ci = bootstrap_ci([float(f) for f in flags], resamples=resamples, seed=seed)
    return {
        "n": n,
        "positive": k,
        "rate": round(k / n, 4) if n else None,
        "ci95": None if ci is None else [round(ci[0], 4), round(ci[1], 4)],
        "unjudged": unjudged,
    }


def _agreement(df: pl.DataFrame, item: str, label: pl.Expr) -> dict[str, Any] | None:
    """Cohen's kappa per judge pair and Fleiss' kappa (eval/agreement.py); None for 1 judge."""
    if df.height == 0 or df["judge_name"].n_unique() < 2:
        return None
    frame = df.select(
        pl.col(item).alias("question_id"), "judge_name", "judge_model", label.alias("label")
    )
    return judge_agreement(frame).as_dict()


def extraction_summary(df: pl.DataFrame, *, resamples: int, seed: int) -> dict[str, Any]:
    """Unsupported-entry rate per judge: overall, by kind, by conversation; plus agreement."""
    judges: dict[str, Any] = {}
    for name in dict.fromkeys(df["judge_name"].to_list()):
        rows = df.filter(pl.col("judge_name") == name)

        def stats(part: pl.DataFrame) -> dict[str, Any]:
            judged = part.filter(pl.col("supported").is_not_null())
            unsupported = [not s for s in judged["supported"].to_list()]
            return rate_stats(
                unsupported, part.height - judged.height, resamples=resamples, seed=seed
            )

        judges[name] = {
            "judge_model": rows["judge_model"][0],
            "overall": stats(rows),
            "by_kind": {str(k): stats(p) for (k,), p in sorted(rows.group_by("kind"), key=_key)},
            "by_conv": {str(c): stats(p) for (c,), p in sorted(rows.group_by("conv_id"), key=_key)},
        }
    return {
        "metric": "unsupported (hallucinated) share of audited entries",
        "entries_audited": df["entry_id"].n_unique() if df.height else 0,
        "judges": judges,
        "agreement": _agreement(df, "entry_id", pl.col("supported")),
    }


def consolidation_summary(df: pl.DataFrame, *, resamples: int, seed: int) -> dict[str, Any]:
    """Spurious share of the links B adds over A, per judge and conversation; plus agreement.

    Agreement is per window (links differ between judges, windows do not): label = the window's
    added links are all grounded (True) or at least one is spurious (False).
    """
    judges: dict[str, Any] = {}
    for name in dict.fromkeys(df["judge_name"].to_list()):
        rows = df.filter(pl.col("judge_name") == name)

        def stats(part: pl.DataFrame) -> dict[str, Any]:
            judged = part.filter(pl.col("judged").fill_null(False))
            flags = [v == "spurious" for vs in judged["verdicts"].to_list() for v in (vs or [])]
            out = rate_stats(flags, part.height - judged.height, resamples=resamples, seed=seed)
            # Links, not windows, are the unit of the rate; windows are reported alongside.
            return {
                "spurious": out["positive"],
                "total": out["n"],
                "rate": out["rate"],
                "ci95": out["ci95"],
                "windows": part.height,
                "windows_judged": judged.height,
                "unjudged": out["unjudged"],
            }

        judges[name] = {
            "judge_model": rows["judge_model"][0],
            "overall": stats(rows),
            "by_conv": {str(c): stats(p) for (c,), p in sorted(rows.group_by("conv_id"), key=_key)},
        }
    variants = sorted(set(df["prompt_variant"].drop_nulls().to_list())) if df.height else []
    seed_ks = sorted(set(df["seed_k"].drop_nulls().to_list())) if df.height else []
    clean = pl.when(pl.col("judged").fill_null(False)).then(pl.col("n_spurious") == 0)
    return {
        "metric": "spurious share of the cross-event links summary B adds over summary A (K=0)",
        "prompt_variant": ", ".join(variants) or None,
        "seed_k": seed_ks[0] if len(seed_ks) == 1 else seed_ks,
        "windows_audited": df["synth_id"].n_unique() if df.height else 0,
        "judges": judges,
        "agreement": _agreement(df, "synth_id", clean.otherwise(None)),
    }


def _key(kv: tuple[tuple[Any, ...], Any]) -> str:
    return str(kv[0][0])


# ---- summary files ----------------------------------------------------------------------------
def audit_summary(
    run_dir: str | Path,
    *,
    extraction: pl.DataFrame | None = None,
    consolidation: pl.DataFrame | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Both audits' summaries from the run's tables; a frame passed in replaces its table."""
    run = RunDir(run_dir)
    if extraction is None and run.has_table(EXTRACTION_TABLE):
        extraction = run.read_table(EXTRACTION_TABLE)
    if consolidation is None and run.has_table(CONSOLIDATION_TABLE):
        consolidation = run.read_table(CONSOLIDATION_TABLE)
    out: dict[str, Any] = {}
    if extraction is not None:
        out["extraction"] = extraction_summary(extraction, resamples=resamples, seed=seed)
    if consolidation is not None:
        out["consolidation"] = consolidation_summary(consolidation, resamples=resamples, seed=seed)
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def _ci(ci: Sequence[float] | None) -> str:
    return "–" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _kappa_lines(agreement: Mapping[str, Any] | None, unit: str) -> list[str]:
    if not agreement:
        return []
    lines = [f"Judge agreement ({unit}):", ""]
    for p in agreement["pairs"]:
        lines.append(
            f"- {p['judge_a']} vs {p['judge_b']}: Cohen's kappa {p['cohen_kappa']} (n = {p['n']})"
        )
    lines += [f"- Fleiss' kappa: {agreement['fleiss_kappa']} (n = {agreement['fleiss_n']})", ""]
    return lines


def audit_markdown(summary: Mapping[str, Any]) -> str:
    """The report section: one table per audit, per judge, then agreement."""
    lines = ["## Fidelity audits (paper Appendix A.6)", ""]
    ext = summary.get("extraction")
    if ext:
        lines += [
            f"### Extraction: unsupported entries ({ext['entries_audited']} entries audited; paper Table 6: 2.36% mean)",
            "",
            "| judge | scope | n | unsupported | rate | 95% CI | unjudged |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, j in ext["judges"].items():
            scopes = [("overall", j["overall"])]
            scopes += [(f"kind={k}", v) for k, v in j["by_kind"].items()]
            scopes += [(f"conv={k}", v) for k, v in j["by_conv"].items()]
            for scope, s in scopes:
                lines.append(
                    f"| {name} | {scope} | {s['n']} | {s['positive']} | {_pct(s['rate'])} | "
                    f"{_ci(s['ci95'])} | {s['unjudged']} |"
                )
        lines += ["", *_kappa_lines(ext.get("agreement"), "per entry, supported vs unsupported")]
    con = summary.get("consolidation")
    if con:
        lines += [
            (
                f"### Consolidation: spurious cross-event links (variant {con['prompt_variant']}, "
                f"K = {con['seed_k']} vs K = 0; {con['windows_audited']} windows; paper Table 7: "
                f"0.61-3.63% constrained, 7.45-20.00% unconstrained)"
            ),
            "",
            "| judge | scope | windows judged | links | spurious | rate | 95% CI | unjudged |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, j in con["judges"].items():
            for scope, s in [
                ("overall", j["overall"]),
                *((f"conv={k}", v) for k, v in j["by_conv"].items()),
            ]:
                lines.append(
                    f"| {name} | {scope} | {s['windows_judged']}/{s['windows']} | {s['total']} | "
                    f"{s['spurious']} | {_pct(s['rate'])} | {_ci(s['ci95'])} | {s['unjudged']} |"
                )
        lines += [
            "",
            *_kappa_lines(con.get("agreement"), "per window, all links grounded vs any spurious"),
        ]
    if not ext and not con:
        lines.append(
            "No audit tables in this run (list audit_extraction / audit_consolidation in stages)."
        )
    lines.append(
        "Unjudged = the judge reply had no readable label/link list: recorded in the audit tables, "
        "left out of the rates."
    )
    return "\n".join(lines) + "\n"
