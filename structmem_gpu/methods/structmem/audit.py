"""What both StructMem fidelity audits share: the `audit:` settings (conf/audit/default.yaml),
the audit tables' columns, the judge-panel fingerprint and report/audit.{json,md}.

The stages are audit_extraction.py (paper Table 6) and audit_consolidation.py (Table 7); the
rates and the report section they write come from eval/audit.py, which the report stage reads
too.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, ClassVar

from pydantic import Field

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir, atomic_write_text
from structmem_gpu.config.settings import COUNT, External, SIZE, Settings, TEMPERATURE, TOKENS
from structmem_gpu.eval.audit import (
    CONSOLIDATION_TABLE,
    EXTRACTION_TABLE,
    audit_markdown,
    audit_summary,
)

__all__ = [
    "CONSOLIDATION_COLUMNS",
    "CONSOLIDATION_TABLE",
    "EXTRACTION_COLUMNS",
    "EXTRACTION_TABLE",
    "AuditSettings",
    "judge_panel_identity",
    "write_audit_report",
]

log = logging.getLogger(__name__)

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


class AuditExtraction(Settings):
    """audit.extraction: one judgment per audited entry."""

    sample_size: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Entries audited: null = every entry (paper Table 6); N = a seeded random sample of N "
        "(cheaper; the report's bootstrap interval widens as N shrinks)."))
    max_tokens: TOKENS = Field(96, description=(
        "Reply budget per entry judgment; the reason is cut to what fits, so a capped reply stays "
        "valid JSON. Larger = longer reasons, more decode time."))
    reason_max_chars: SIZE = Field(160, description=(
        "maxLength of the one-line reason (before the label); lowered automatically to fit "
        "max_tokens."))


class AuditConsolidation(Settings):
    """audit.consolidation: one judgment per synthesis window."""

    max_tokens: TOKENS = Field(384, description=(
        "Reply budget per window (the link list); larger lets the judge list more / longer links."))
    link_max_chars: SIZE = Field(120, description=(
        "maxLength of each listed link; lowered automatically so max_links links fit max_tokens."))
    max_links: SIZE = Field(8, description=(
        "maxItems of the link list: links a synthesis adds beyond this are not audited (raise it "
        "for long syntheses; each link costs ~link_max_chars/1.5 + 14 tokens)."))


class AuditSettings(Settings):
    """The `audit:` block (conf/audit/default.yaml, generated from these fields below its
    header; its values are the defaults for configs without it) and the report's bootstrap
    knobs."""

    node: ClassVar[str] = "audit"
    yaml_home: ClassVar[str | None] = "audit/default.yaml"

    seed: Annotated[int, Field(ge=0)] = Field(0, description=(
        "Seed of the extraction sample: the same run and seed audit the same entries everywhere."))
    temperature: TEMPERATURE = Field(0.0, description=(
        "Judge sampling temperature (0 = deterministic verdicts, cacheable)."))
    extraction: AuditExtraction = Field(AuditExtraction(), description=(
        "The extraction audit (stage audit_extraction)."))
    consolidation: AuditConsolidation = Field(AuditConsolidation(), description=(
        "The consolidation audit (stage audit_consolidation)."))
    bootstrap_resamples: Annotated[COUNT, External("report.bootstrap_resamples")] = 1000
    bootstrap_seed: Annotated[Annotated[int, Field(ge=0)], External("report.bootstrap_seed")] = 0

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


def write_audit_report(run: RunDir, job: JobConfig, **frames: pl.DataFrame) -> dict[str, Any]:
    """report/audit.json + report/audit.md, with this stage's fresh frame in place of its table."""
    s = job.settings(AuditSettings)
    summary = audit_summary(
        run.root, resamples=s.bootstrap_resamples, seed=s.bootstrap_seed, **frames
    )
    atomic_write_text(run.report_dir / "audit.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(run.report_dir / "audit.md", audit_markdown(summary))
    log.info("audit: wrote %s", run.report_dir / "audit.md")
    return summary


def judge_panel_identity(job: JobConfig) -> dict[str, Any]:
    """Fingerprint material: the judge panel (names, models, no connection settings)."""
    from structmem_gpu.eval.judge import judge_identity

    ident = judge_identity(job)
    return {"panel": ident["panel"], "answer_llm": ident["answer_llm"]}
