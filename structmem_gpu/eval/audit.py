"""Fidelity audits (StructMem paper Appendix A.6): shared settings, rates, summary and report.

    python jobs/run.py benchmark=sample method=structmem \
        stages=[audit_extraction,audit_consolidation,report] audit.extraction.sample_size=20
    # or the full Table 6/7 experiment: python jobs/run.py -m experiment=fidelity ...

The two stages live in audit_extraction.py (Table 6: share of extracted entries a judge finds
unsupported by their source turn) and audit_consolidation.py (Table 7: share of the cross-event
links a synthesis adds over its buffer-only twin that a judge finds spurious). This module
holds what both need: the `audit:` settings (conf/audit/default.yaml), the rate statistics with
bootstrap intervals, judge agreement, and `audit_summary(run_dir)` / `audit_markdown(summary)`
that the stages use to write report/audit.json + report/audit.md (and the report stage may use
for its own report.md section). A row with `label`/`judged` null is unjudged: recorded, left
out of every rate, counted in `unjudged`, never counted as supported or grounded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import polars as pl
from omegaconf import DictConfig

from structmem_gpu.artifacts import RunDir, atomic_write_text
from structmem_gpu.analysis.agreement import judge_agreement
from structmem_gpu.eval.bootstrap import bootstrap_ci
from structmem_gpu.settings import COUNT, SIZE, TEMPERATURE, TOKENS, Int, Settings, knob, sub

log = logging.getLogger(__name__)

EXTRACTION_TABLE = "audit_extraction"
CONSOLIDATION_TABLE = "audit_consolidation"

# JSON overhead of {"reason": "...", "label": "UNSUPPORTED"} in tokens and characters per token
# (SmolLM2 is ~1.5 chars/token on dates and digits; see eval/judge.py): the reason's maxLength
# never exceeds what fits in max_tokens, so a capped reply is still valid JSON.
_JSON_OVERHEAD_TOKENS = 24
_CHARS_PER_TOKEN = 1.5
# Per-link JSON overhead ({"link": "", "verdict": "spurious"},) in tokens.
_LINK_OVERHEAD_TOKENS = 14

_STR, _BOOL, _I32 = pl.String(), pl.Boolean(), pl.Int32()

EXTRACTION_COLUMNS: dict[str, pl.DataType] = {
    "audit_id": _STR,  # hash(entry_id, judge_name): one row per (entry, judge)
    "conv_id": _STR,
    "entry_id": _STR,
    "event_id": _STR,
    "kind": _STR,  # fact | relation
    "entry_text": _STR,
    "judge_name": _STR,
    "judge_model": _STR,
    "prompt_version": _STR,
    "label": _STR,  # "supported" | "unsupported" | null (unjudged)
    "supported": _BOOL,  # null = unjudged
    "reason": _STR,
    "reply_raw": _STR,
    "request_id": _STR,
    "finish_reason": _STR,
}

CONSOLIDATION_COLUMNS: dict[str, pl.DataType] = {
    "audit_id": _STR,  # hash(synth_id, judge_name): one row per (window, judge)
    "conv_id": _STR,
    "window_index": _I32,
    "synth_id": _STR,
    "prompt_variant": _STR,  # the synthesis under test's variant (constrained | unconstrained)
    "seed_k": _I32,  # the synthesis under test's K (summary A always has K = 0)
    "judge_name": _STR,
    "judge_model": _STR,
    "prompt_version": _STR,
    "judged": _BOOL,  # null = unjudged (no readable link list)
    "links": pl.List(_STR),
    "verdicts": pl.List(_STR),
    "n_links": _I32,  # null when unjudged
    "n_spurious": _I32,  # null when unjudged
    "summary_a": _STR,
    "summary_b": _STR,
    "reply_raw": _STR,
    "request_id": _STR,
    "finish_reason": _STR,
}


@dataclass(frozen=True)
class AuditExtraction(Settings):
    sample_size: int | None = knob(Int(ge=1, null=True), None)  # None = every entry
    max_tokens: int = knob(TOKENS, 96)
    reason_max_chars: int = knob(SIZE, 160)


@dataclass(frozen=True)
class AuditConsolidation(Settings):
    max_tokens: int = knob(TOKENS, 384)
    link_max_chars: int = knob(SIZE, 120)
    max_links: int = knob(SIZE, 8)


@dataclass(frozen=True)
class AuditSettings(Settings):
    """The `audit:` block (conf/audit/default.yaml; its values are the defaults for configs
    without it) and the report's bootstrap knobs."""

    node: ClassVar[str] = "audit"

    seed: int = knob(Int(ge=0), 0)
    temperature: float = knob(TEMPERATURE, 0.0)
    extraction: AuditExtraction = sub(AuditExtraction, default=AuditExtraction())
    consolidation: AuditConsolidation = sub(AuditConsolidation, default=AuditConsolidation())
    bootstrap_resamples: int = knob(COUNT, 1000, external="report.bootstrap_resamples")
    bootstrap_seed: int = knob(Int(ge=0), 0, external="report.bootstrap_seed")

    @property
    def extraction_sample_size(self) -> int | None:
        return self.extraction.sample_size

    @property
    def extraction_max_tokens(self) -> int:
        return self.extraction.max_tokens

    @property
    def reason_max_chars(self) -> int:
        return self.extraction.reason_max_chars

    @property
    def consolidation_max_tokens(self) -> int:
        return self.consolidation.max_tokens

    @property
    def link_max_chars(self) -> int:
        return self.consolidation.link_max_chars

    @property
    def max_links(self) -> int:
        return self.consolidation.max_links

    def reason_chars(self) -> int:
        """Configured reason bound, lowered to what fits in the extraction audit's max_tokens."""
        fits = int((self.extraction_max_tokens - _JSON_OVERHEAD_TOKENS) * _CHARS_PER_TOKEN)
        return max(16, min(self.reason_max_chars, fits))

    def link_chars(self) -> int:
        """Configured link bound, lowered so `max_links` links fit in max_tokens."""
        per_link = self.consolidation_max_tokens / max(1, self.max_links) - _LINK_OVERHEAD_TOKENS
        return max(16, min(self.link_max_chars, int(per_link * _CHARS_PER_TOKEN)))


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
    """Cohen's kappa per judge pair and Fleiss' kappa (analysis/agreement.py); None for 1 judge."""
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


def write_audit_report(run: RunDir, cfg: DictConfig, **frames: pl.DataFrame) -> dict[str, Any]:
    """report/audit.json + report/audit.md, with this stage's fresh frame in place of its table."""
    s = AuditSettings.from_cfg(cfg)
    summary = audit_summary(
        run.root, resamples=s.bootstrap_resamples, seed=s.bootstrap_seed, **frames
    )
    atomic_write_text(run.report_dir / "audit.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(run.report_dir / "audit.md", audit_markdown(summary))
    log.info("audit: wrote %s", run.report_dir / "audit.md")
    return summary


def judge_panel_identity(cfg: DictConfig) -> dict[str, Any]:
    """Fingerprint material: the judge panel (names, models, no connection settings)."""
    from structmem_gpu.eval.judge import judge_identity

    ident = judge_identity(cfg)
    return {"panel": ident["panel"], "answer_llm": ident["answer_llm"]}
