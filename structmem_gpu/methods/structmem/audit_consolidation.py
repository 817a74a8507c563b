"""Stage `audit_consolidation`: share of spurious cross-event links in the run's syntheses.

    python jobs/run.py benchmark=sample method=structmem stages=[audit_consolidation] \
        hydra.run.dir=EXISTING_RUN      # audits that run's syntheses (its seed_k and variant)

StructMem paper Appendix A.6, Table 7. For every window of the run's syntheses ("summary B",
seed_k = K, the run's prompt variant) the stage rebuilds the buffer-only synthesis ("summary
A", K = 0, same variant) with the consolidate stage's own planning code
(methods/structmem/consolidate.py: conversation_views + plan_conversation with seed_k = 0), so
its requests are byte-identical to a `consolidate.seed_k=0` run's and the response cache serves
them across runs; they go out in one batch. Then each judge of the panel gets one request per
window (one batch per judge): buffer, the entries retrieved for B, A and B; it lists the links
B adds over A and labels each grounded or spurious. One row per (window, judge):

    {"synth_id": "a41c...", "judge_name": "same_as_llm", "judged": True,
     "links": ["Biscuit follows the shelter plan"], "verdicts": ["grounded"], "n_links": 1,
     "n_spurious": 0, ...}

A reply without a readable link list gives judged = null (unjudged): recorded, left out of the
rates. Windows whose synthesis failed (parse_ok false) are not audited (ctx.notes counts them);
windows whose synthesis had no related entries (B's request is A's) get a rule row with zero
links and no judge call (judge_model "rule:no-related-entries").
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.methods.structmem.audit import (
    CONSOLIDATION_COLUMNS,
    CONSOLIDATION_TABLE,
    AuditSettings,
    judge_panel_identity,
    write_audit_report,
)
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.eval.judge import judge_count
from structmem_gpu.llm.structured import strip_fences
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.structmem.audit_api import (
    ConsolidateSettings,
    WindowPlan,
    conversation_views,
    plan_conversation,
)
from structmem_gpu.methods.structmem.prompts import audit_consolidation as prompt
from structmem_gpu.methods.structmem.prompts import synthesis
from structmem_gpu.config.settings import External
from structmem_gpu.core.stage_parts import AUDIT
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)

STAGE_NAME = "audit_consolidation"


@dataclass(frozen=True)
class LinkItem:
    plan_a: WindowPlan  # the K = 0 plan of the window (its request builds summary A)
    synth: dict[str, Any]  # the syntheses row under test (summary B)
    summary_a: str


def count_links(data: Any, text: str) -> tuple[list[str], list[str]] | None:
    """(links, verdicts) from a judge reply; None (unjudged) unless every item is readable.

    Uses the schema-validated object, else a lenient JSON read of the raw text. One item with
    an unknown verdict makes the whole reply unjudged: a partial list would bias the rate.
    """
    obj = data
    if not isinstance(obj, Mapping):
        try:
            obj = json.loads(strip_fences(text or ""))
        except json.JSONDecodeError:
            return None
    links = obj.get("links") if isinstance(obj, Mapping) else None
    if not isinstance(links, list):
        return None
    texts, verdicts = [], []
    for item in links:
        verdict = str(item.get("verdict", "")).strip().lower() if isinstance(item, Mapping) else ""
        if verdict not in prompt.VERDICTS:
            return None
        texts.append(str(item.get("link") or ""))
        verdicts.append(verdict)
    return texts, verdicts


def plans_k0(ctx: StageContext, s: ConsolidateSettings) -> dict[tuple[str, int], WindowPlan]:
    """(conv_id, window_index) -> the K = 0 plan, built by the consolidate stage's code."""
    k0 = s.model_copy(update={"seed_k": 0})
    views = conversation_views(ctx.read("entries"), ctx.read("entry_embeddings"), s.window_seconds)
    out = {}
    for v in views:
        # K = 0 selects no seeds whatever the query, so no encoder call is needed.
        queries = np.zeros((len(v.windows), v.matrix.shape[1]), dtype=np.float32)
        for p in plan_conversation(v, queries, k0):
            out[(v.conv_id, p.window.index)] = p
    return out


def _as_audit_request(req: LLMRequest) -> LLMRequest:
    # The cache key ignores stage and request_id, so renaming them keeps the cache hit while
    # requests.parquet files these rows under this stage (not as duplicate consolidate rows).
    rid = request_id(STAGE_NAME, "summary_a", req.request_id)
    return dataclasses.replace(req, request_id=rid, stage=STAGE_NAME)


def _lines(rows: Mapping[str, dict[str, Any]], ids: Sequence[str]) -> list[str]:
    out = []
    for i in ids:
        r = rows.get(i)
        if r is not None:
            out.append(
                f"- [{r['event_time']:%Y-%m-%d %H:%M}] {r['speaker']} ({r['kind']}): {r['text']}"
            )
    return out


def build_request(
    item: LinkItem, entries: Mapping[str, dict[str, Any]], judge_name: str, s: AuditSettings
) -> LLMRequest:
    b = item.synth
    msgs = prompt.build_messages(
        _lines(entries, b["buffer_entry_ids"] or []),
        _lines(entries, b["context_entry_ids"] or []),
        item.summary_a,
        b["text"] or "",
    )
    sch = prompt.schema(s.max_links, s.link_chars())
    samp = Sampling(temperature=s.temperature, max_tokens=s.consolidation_max_tokens)
    rid = request_id(STAGE_NAME, judge_name, b["synth_id"], prompt.VERSION, msgs[-1].content, sch)
    return LLMRequest(rid, STAGE_NAME, msgs, prompt.VERSION, samp, sch, b["conv_id"])


RULE_NO_CONTEXT = "rule:no-related-entries"


def _row_key(b: Mapping[str, Any], judge_name: str, seed_k: int) -> dict[str, Any]:
    return {
        "audit_id": stable_hash("audit_consolidation", b["synth_id"], judge_name),
        "conv_id": b["conv_id"],
        "window_index": b["window_index"],
        "synth_id": b["synth_id"],
        "prompt_variant": str(b["prompt_version"] or "").partition("+")[2] or None,
        "seed_k": seed_k,
        "judge_name": judge_name,
    }


def rule_row(b: Mapping[str, Any], judge_name: str, seed_k: int) -> dict[str, Any]:
    """A window whose synthesis had no related entries: its request WAS the K = 0 request, so
    B = A and it adds no link by construction; recorded without a judge call (a judge would
    only add noise), left out of agreement like every rule verdict."""
    return {
        **_row_key(b, judge_name, seed_k),
        "judge_model": RULE_NO_CONTEXT,
        "prompt_version": RULE_NO_CONTEXT,
        "judged": True,
        "links": [],
        "verdicts": [],
        "n_links": 0,
        "n_spurious": 0,
        "summary_a": b["text"],
        "summary_b": b["text"],
        "reply_raw": None,
        "request_id": None,
        "finish_reason": None,
    }


def audit_row(
    item: LinkItem,
    judge_name: str,
    req: LLMRequest,
    res: LLMResult,
    fallback_model: str,
    seed_k: int,
) -> dict[str, Any]:
    parsed = count_links(res.data, res.text)
    b = item.synth
    return {
        **_row_key(b, judge_name, seed_k),
        "judge_model": res.model or fallback_model,
        "prompt_version": req.prompt_version,
        "judged": None if parsed is None else True,
        "links": None if parsed is None else parsed[0],
        "verdicts": None if parsed is None else parsed[1],
        "n_links": None if parsed is None else len(parsed[1]),
        "n_spurious": None if parsed is None else sum(v == prompt.SPURIOUS for v in parsed[1]),
        "summary_a": item.summary_a,
        "summary_b": b["text"],
        "reply_raw": res.text,
        "request_id": req.request_id,
        "finish_reason": res.finish_reason,
    }


class ConsolidationAuditSettings(AuditSettings):
    """The audit block, and the consolidate node whose windows are audited."""

    consolidate: Annotated[ConsolidateSettings, External("consolidate")]


def run_audit_consolidation(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: ConsolidationAuditSettings = ctx.settings
    cs = s.consolidate
    syntheses = ctx.read("syntheses").sort("conv_id", "window_index")
    plans = plans_k0(ctx, cs)
    targets, skipped_failed, mismatched = [], 0, 0
    no_context: list[dict[str, Any]] = []
    for b in syntheses.iter_rows(named=True):
        plan = plans.get((b["conv_id"], b["window_index"]))
        if not b["parse_ok"] or not (b["text"] or "").strip():
            skipped_failed += 1
        elif plan is None or tuple(b["buffer_entry_ids"] or ()) != plan.buffer_ids:
            # The entries or window settings changed since consolidate ran: A would not be B's twin.
            mismatched += 1
        elif not (b["context_entry_ids"] or []):
            no_context.append(b)
        else:
            targets.append((plan, b))
    if mismatched:
        log.warning(
            "%s: %d windows no longer match the syntheses (rerun consolidate); skipped",
            STAGE_NAME,
            mismatched,
        )
    a_requests = [_as_audit_request(p.request) for p, _ in targets]
    a_results = ctx.generate(a_requests, desc=f"{STAGE_NAME}:summary_a")  # one batch, all windows
    items = [LinkItem(p, b, r.text.strip()) for (p, b), r in zip(targets, a_results, strict=True)]
    entries = {r["entry_id"]: r for r in ctx.read("entries").iter_rows(named=True)}
    rows: list[dict[str, Any]] = []
    for name, backend in ctx.backends.judges():
        rows += [rule_row(b, name, cs.seed_k) for b in no_context]
        requests = [build_request(it, entries, name, s) for it in items]
        results = ctx.generate(requests, backend=backend, desc=f"{STAGE_NAME}:{name}")  # one batch
        rows += [
            audit_row(it, name, q, r, backend.model_id, cs.seed_k)
            for it, q, r in zip(items, requests, results, strict=True)
        ]
    df = schemas.frame(rows, CONSOLIDATION_COLUMNS)
    unjudged = int(df["judged"].is_null().sum())
    ctx.notes.update(
        windows=syntheses.height,
        audited=len(items),
        no_related_entries=len(no_context),
        skipped_failed_syntheses=skipped_failed,
        skipped_mismatched=mismatched,
        rows=df.height,
        unjudged=unjudged,
        prompt_variant=synthesis.prompt_version(cs.prompt_variant),
        summary_a_empty=sum(not it.summary_a for it in items),
    )
    if unjudged:
        log.warning(
            "%s: %d of %d replies unjudged (no readable link list)", STAGE_NAME, unjudged, df.height
        )
    summary = write_audit_report(ctx.run, ctx.job, consolidation=df)
    ctx.notes["spurious_rate"] = {
        n: j["overall"]["rate"] for n, j in summary["consolidation"]["judges"].items()
    }
    return {CONSOLIDATION_TABLE: df}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

# A link list of a few short phrases with their verdicts, in JSON (capped by max_tokens).
AUDIT_LINKS_COMPLETION = 80


def estimate_audit_consolidation(inp: EstimateInputs) -> StageEstimate:
    """An UPPER BOUND: the consolidate stage's windows (`consolidate.stand_in_windows`, the
    stage's count when every session yields an entry); per window one summary-A request (the
    window's synthesis request with seed_k = 0) and one link request per judge. A window
    whose synthesis failed or had no related entries sends none (judged by rule), which only
    replies decide. Prompts: the real messages on the stand-in entries, with summaries A and
    B at the synthesis' expected length (consolidate's stand-in)."""
    from structmem_gpu.methods.structmem.audit_api import (
        SYNTHESIS_COMPLETION,
        stand_in_synthesis,
        stand_in_windows,
    )

    s = inp.job.settings(ConsolidationAuditSettings)
    cs = s.consolidate
    judges = judge_count(inp)

    def lines(records: Sequence[Any]) -> list[str]:  # as _lines renders entries rows
        return [f"- [{r.time:%Y-%m-%d %H:%M}] {r.speaker} ({r.kind}): {r.text}" for r in records]

    tokens = over = n = 0
    for index, (conv_id, buffer, context) in enumerate(stand_in_windows(inp, cs)):
        a_msgs = synthesis.build_messages(cs.prompt_variant, buffer, [])
        text = stand_in_synthesis(conv_id, index, buffer, cs)["text"]
        j_msgs = prompt.build_messages(lines(buffer), lines(context), text, text)
        prompt_a, prompt_j = inp.counter.messages(a_msgs), inp.counter.messages(j_msgs)
        tokens += prompt_a + judges * prompt_j
        over += inp.over(a_msgs, cs.max_tokens)
        over += judges * inp.over(j_msgs, s.consolidation_max_tokens, judge=True)
        n += 1
    completion = n * (min(cs.max_tokens, SYNTHESIS_COMPLETION)
                      + judges * min(s.consolidation_max_tokens, AUDIT_LINKS_COMPLETION))
    return StageEstimate(
        STAGE_NAME, n * (1 + judges), tokens, completion,
        f"upper bound: {n} windows x (1 summary A + {judges} judge(s)); none for a failed "
        "synthesis or one without related entries",
        over if inp.checked else None, bound=True,
    )


STAGE = Stage(
    name=STAGE_NAME,
    run=run_audit_consolidation,
    reads=("entries", "entry_embeddings", "syntheses"),
    writes=(CONSOLIDATION_TABLE,),
    settings=ConsolidationAuditSettings,
    depends=(*EMBEDDER_IDENTITY, *LLM_IDENTITY),
    extra_fingerprint=judge_panel_identity,
    uses=("llm", "judges"),
    estimate=estimate_audit_consolidation,
    part=AUDIT,
)
