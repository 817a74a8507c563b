"""Stage `audit_extraction`: share of extracted entries not supported by their source turn.

    python jobs/run.py benchmark=sample method=structmem stages=[audit_extraction] \
        audit.extraction.sample_size=20 hydra.run.dir=EXISTING_RUN

StructMem paper Appendix A.6, Table 6. Every entry (or a seeded sample of
`audit.extraction.sample_size`, drawn over entries sorted by entry_id so the same run and seed
give the same sample on every machine) gets one judge request per judge of the panel: the
extraction window the entry came from (rebuilt with the extract stage's own planner from
`extract.window_tokens` / `turns_per_request` / `context_turns`, so the judge sees what the
extractor saw),
its source turn, and the entry. One batch per judge. One row per (entry, judge):

    {"entry_id": "3f0c...", "kind": "fact", "judge_name": "same_as_llm", "label": "supported",
     "supported": True, "reason": "Turn 2 says so.", "reply_raw": "{...}", ...}

An unreadable reply gives label = supported = null (unjudged): recorded, never counted as
supported. Writes tables/audit_extraction.parquet and report/audit.{json,md}.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.methods.structmem.audit import (
    EXTRACTION_COLUMNS,
    EXTRACTION_TABLE,
    AuditSettings,
    judge_panel_identity,
    write_audit_report,
)
from structmem_gpu.eval.judge import judge_count, parse_label
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.llm.structured import strip_fences
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.structmem.audit_api import (
    ExtractionWindow,
    ExtractSettings,
    plan_from_settings,
)
from structmem_gpu.methods.structmem.prompts import audit_extraction as prompt
from structmem_gpu.config.settings import External
from structmem_gpu.core.stage_parts import AUDIT
from structmem_gpu.stage import LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

STAGE_NAME = "audit_extraction"


@dataclass(frozen=True)
class AuditItem:
    entry: dict[str, Any]  # one entries row
    window: ExtractionWindow
    source_index: int  # 1-based position of the source turn in the excerpt (context + turns)


def sample_entries(entries: pl.DataFrame, size: int | None, seed: int) -> pl.DataFrame:
    """All entries (size None or >= n) or a seeded sample, both sorted by entry_id."""
    ordered = entries.sort("entry_id")
    if size is None or size >= ordered.height:
        return ordered
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(ordered.height, size=size, replace=False))
    return ordered[picked.tolist()]


def audit_items(
    entries: pl.DataFrame, windows: list[ExtractionWindow]
) -> tuple[list[AuditItem], int]:
    """(items, entries whose source turn is in no window): each entry with its extraction window."""
    where: dict[str, tuple[ExtractionWindow, int]] = {}
    for w in windows:
        for i, t in enumerate(w.turns):
            # Source index counts the context lines first: the excerpt is context + turns.
            where[t.event_id] = (w, len(w.context) + i + 1)
    items, orphans = [], 0
    for row in entries.iter_rows(named=True):
        hit = where.get(row["event_id"])
        if hit is None:
            orphans += 1
            continue
        items.append(AuditItem(row, hit[0], hit[1]))
    return items, orphans


def build_request(item: AuditItem, judge_name: str, s: AuditSettings) -> LLMRequest:
    w = item.window
    excerpt = [(t.speaker, t.text) for t in (*w.context, *w.turns)]
    msgs = prompt.build_messages(
        w.session_time, excerpt, item.source_index, item.entry["kind"], item.entry["text"]
    )
    sch = prompt.schema(s.reason_chars())
    samp = Sampling(temperature=s.temperature, max_tokens=s.extraction_max_tokens)
    rid = request_id(
        STAGE_NAME, judge_name, item.entry["entry_id"], prompt.VERSION, msgs[-1].content, sch
    )
    return LLMRequest(rid, STAGE_NAME, msgs, prompt.VERSION, samp, sch, item.entry["conv_id"])


def read_reason(data: Any, text: str) -> str | None:
    """The reply's reason when readable (schema-validated object or raw JSON), else None."""
    obj = data
    if not isinstance(obj, dict) and text:
        try:
            obj = json.loads(strip_fences(text))
        except json.JSONDecodeError:
            return None
    return (
        str(obj.get("reason")) if isinstance(obj, dict) and obj.get("reason") is not None else None
    )


def audit_row(
    item: AuditItem, judge_name: str, req: LLMRequest, res: LLMResult, fallback_model: str
) -> dict[str, Any]:
    # parse_label returns None for anything but the two labels: unjudged, never "supported".
    supported = parse_label(res.data, res.text, prompt.POSITIVE, prompt.NEGATIVE)
    e = item.entry
    return {
        "audit_id": stable_hash("audit_extraction", e["entry_id"], judge_name),
        "conv_id": e["conv_id"],
        "entry_id": e["entry_id"],
        "event_id": e["event_id"],
        "kind": e["kind"],
        "entry_text": e["text"],
        "judge_name": judge_name,
        "judge_model": res.model or fallback_model,
        "prompt_version": req.prompt_version,
        "label": None if supported is None else ("supported" if supported else "unsupported"),
        "supported": supported,
        "reason": read_reason(res.data, res.text),
        "reply_raw": res.text,
        "request_id": req.request_id,
        "finish_reason": res.finish_reason,
    }


def judge_items(ctx: StageContext, items: Sequence[AuditItem], s: AuditSettings) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for name, backend in ctx.backends.judges():
        requests = [build_request(it, name, s) for it in items]
        results = ctx.generate(requests, backend=backend, desc=f"{STAGE_NAME}:{name}")  # one batch
        rows += [
            audit_row(it, name, q, r, backend.model_id)
            for it, q, r in zip(items, requests, results, strict=True)
        ]
    return schemas.frame(rows, EXTRACTION_COLUMNS)


class ExtractionAuditSettings(AuditSettings):
    """The audit block, and the extract node whose windows the judge is shown."""

    extract: Annotated[ExtractSettings, External("extract")]


def run_audit_extraction(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: ExtractionAuditSettings = ctx.settings
    entries, turns = ctx.read("entries"), ctx.read("turns")
    sample = sample_entries(entries, s.extraction_sample_size, s.seed)
    # The extract stage's own windows for this config (token-packed or fixed), so the judge
    # sees exactly what the extractor saw.
    windows, _ = plan_from_settings(turns, s.extract, ctx.job.root.llm)
    items, orphans = audit_items(sample, windows)
    if orphans:
        log.warning(
            "%s: %d sampled entries have a source turn in no extraction window (skipped)",
            STAGE_NAME,
            orphans,
        )
    df = judge_items(ctx, items, s)
    unjudged = int(df["supported"].is_null().sum())
    ctx.notes.update(
        entries=entries.height,
        sampled=sample.height,
        audited=len(items),
        orphans=orphans,
        rows=df.height,
        unjudged=unjudged,
    )
    if unjudged:
        log.warning(
            "%s: %d of %d replies unjudged (no readable label)", STAGE_NAME, unjudged, df.height
        )
    summary = write_audit_report(ctx.run, ctx.job, extraction=df)
    ctx.notes["unsupported_rate"] = {
        name: j["overall"]["rate"] for name, j in summary["extraction"]["judges"].items()
    }
    return {EXTRACTION_TABLE: df}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

AUDIT_LABEL_COMPLETION = 40  # {"label": ..., "reason": one short sentence}


def estimate_audit_extraction(inp: EstimateInputs) -> StageEstimate:
    """Per judge one request per audited entry, on the extract stage's own windows. How many
    entries there are is extract's replies: with extract.max_items an UPPER BOUND (every
    window and perspective at max_items entries), capped by audit.extraction.sample_size;
    without it the expected count, one entry per turn and perspective (a reply may hold
    more: no bound). Prompts: the real messages, each window's turns as the entries' sources
    (an entry restating its turn, cut to max_item_chars)."""
    from structmem_gpu.core.errors import ConfigError

    s = inp.job.settings(ExtractionAuditSettings)
    x = s.extract
    try:
        windows, _ = plan_from_settings(inp.turns, x, inp.job.root.llm)
    except ConfigError as err:  # the window tokenizer is not here: extract's row says so
        return StageEstimate(STAGE_NAME, None, None, None, f"not estimated: {err}")
    judges = judge_count(inp)
    items: list[AuditItem] = []
    for kind in x.perspectives:
        for w in windows:
            for i, t in enumerate(w.turns):
                entry = {"entry_id": f"{kind}:{t.event_id}:{t.part}", "kind": kind,
                         "text": t.text[: x.max_item_chars], "conv_id": w.conv_id}
                items.append(AuditItem(entry, w, len(w.context) + i + 1))
    bounded = x.max_items is not None
    # the most entries the replies can hold (every window at max_items), else one per turn
    most = (len(windows) * len(x.perspectives) * x.max_items) if bounded else len(items)
    n = most if s.extraction_sample_size is None else min(most, s.extraction_sample_size)
    # the stand-in items' mean prompt, per audited entry (the sample is drawn over all entries)
    reqs = [build_request(it, "judge", s) for it in items]
    mean = sum(inp.counter.messages(r.messages) for r in reqs) / max(len(reqs), 1)
    over_share = (sum(inp.over(r.messages, s.extraction_max_tokens, judge=True) for r in reqs)
                  / max(len(reqs), 1))
    return StageEstimate(
        STAGE_NAME, n * judges, round(mean * n * judges), n * judges * min(
            s.extraction_max_tokens, AUDIT_LABEL_COMPLETION),
        (f"upper bound: {len(windows)} windows x {len(x.perspectives)} perspectives x "
         f"extract.max_items entries" if bounded else "expected: one entry per turn and "
         "perspective (no extract.max_items: no bound)")
        + (f", sampled to {s.extraction_sample_size}" if s.extraction_sample_size is not None else "")
        + f", x {judges} judge(s)",
        round(over_share * n * judges) if inp.checked else None, bound=bounded,
    )


STAGE = Stage(
    name=STAGE_NAME,
    run=run_audit_extraction,
    reads=("entries", "turns"),
    writes=(EXTRACTION_TABLE,),
    settings=ExtractionAuditSettings,
    depends=LLM_IDENTITY,
    extra_fingerprint=judge_panel_identity,
    uses=("judges",),
    estimate=estimate_audit_extraction,
    loads=("window_tokenizer",),  # replans extract's windows by extract.window_tokenizer
    part=AUDIT,
)
