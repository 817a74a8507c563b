"""Stage `consolidate`: cross-event consolidation (paper §3.2;
docs/methods.md "StructMem: consolidation").

    python jobs/run.py benchmark=sample method=structmem stages=[consolidate] consolidate.seed_k=10

Per conversation: greedy time windows over the entries (windows.py); per window the buffer,
one aggregated query (`concat`: the buffer texts joined by newlines, encoded as entries are,
without the encoder's question instruction, as the reference does; `mean`: the
normalised mean of the buffer's entry vectors), the top `seed_k` seeds from the seed pool
(`historical`: entries before the window; `global`: every other entry; the window's own
entries too when `seed_exclude_buffer` is false, the reference code's effective pool),
each seed expanded to every entry of its event, and one synthesis request. No synthesis reads
another, so every window of every conversation goes out in ONE `ctx.generate` batch, planned
conversation by conversation as the client draws it (a stream: llm/types.py). Seeds
are scored with one dense (windows x entries) product per conversation rather than a FAISS
index: each window has its own pool, the product is exact, and it is microseconds at a few
thousand entries per conversation. One row:

    SynthesisRow(synth_id="a41c...", conv_id="sample-1", window_index=1,
                 window_start=datetime(2024, 3, 17, 19, 5), window_end=datetime(2024, 3, 17, 19, 48),
                 text="On 2024-03-17 Tomas told Lena ...", buffer_entry_ids=("3f0c...", ...),
                 seed_entry_ids=("77ab...", ...), context_entry_ids=("77ab...", "91de...", ...),
                 request_id="consolidate:5e2f...", prompt_version="synthesis/3+constrained", parse_ok=True)

`consolidate.enabled: false` writes empty tables and sends nothing; `seed_k: 0` gives
buffer-only syntheses. Syntheses with parse_ok and non-empty text are embedded into
tables/synthesis_embeddings.

ctx.notes: enabled, conversations, windows, requests, parse_failures, truncated,
buffer_entries_mean, seeds_mean, context_entries_mean, syntheses_embedded, and the encoder
counters (embedded_new, cache_hits, embed_s, embeddings_per_s).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TYPE_CHECKING

from pydantic import Field

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.core.threads import one_thread
from structmem_gpu.llm.tokens import CHARS_PER_TOKEN
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.structmem.embed import (
    attach_embeddings,
    embedding_matrix,
    embeddings_frame,
    encode_notes,
)
from structmem_gpu.methods.structmem.windows import (
    SEED_SCOPES,
    Window,
    event_index,
    reconstruct_events,
    seed_pool,
    top_k_in_pool,
    windows_by_conversation,
)
from structmem_gpu.methods.structmem.prompts import synthesis
from structmem_gpu.methods.structmem.prompts.reference import texts_fingerprint
from structmem_gpu.config.settings import (
    COUNT,
    External,
    Settings,
    TEMPERATURE,
    TOKENS,
    TOP_P,
    YamlExpr,
)
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

if TYPE_CHECKING:
    from structmem_gpu.methods.structmem.extract import ExtractSettings

log = logging.getLogger(__name__)

STAGE_NAME = "consolidate"
QUERY_MODES = ("concat", "mean")


class ConsolidateSettings(Settings):
    """conf/method/structmem.yaml `consolidate:` (+ prompts.sources.lightmem); the block is
    generated from these fields."""

    node: ClassVar[str] = "consolidate"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    enabled: bool = Field(True, description=(
        'false = "w/o cross-event" ablation (paper Table 2): no syntheses at all.'))
    # An int default: the composed config (and so the config hash) has always held 3600.
    window_seconds: Annotated[float, Field(gt=0)] = Field(3600, description=(
        "Greedy windows on conversation time: a window takes entries within this many seconds "
        "of its first entry (3600 = paper's 1 hour; LoCoMo sessions are >1 day apart -> 1 "
        "window/session)."))
    seed_k: COUNT = Field(15, description=(
        "Top-K seed entries retrieved for each window (paper Fig. 3d sweeps 0,5,10,15,20)."))
    seed_scope: Literal[SEED_SCOPES] = Field("historical", description=(
        "historical = only entries before the window (paper text, online-agent view); global = "
        "every other entry, future ones too (what the reference code does)."))
    query_mode: Literal[QUERY_MODES] = Field("concat", description=(
        "concat = embed the buffer texts joined by newlines (paper); mean = normalised mean of "
        "the entry embeddings (avoids encoder truncation of long buffers)."))
    seed_exclude_buffer: bool = Field(True, description=(
        "Seed pool includes the window's own entries when false (the reference code's effective "
        "behaviour: its buffer filter is broken); true = the paper's intent (default)."))
    prompt_variant: Literal["constrained", "unconstrained"] = Field("constrained", description=(
        "constrained = every instruction of the reference synthesis prompt (default); "
        "unconstrained = paper Fig. 20 / Table 7 ablation: the same text minus its grounding "
        "lines."))
    max_tokens: Annotated[TOKENS, YamlExpr("${llm_or:budgets.synthesis_max_tokens,1024}")] = Field(1024, description=(
        "Reply budget from the LLM profile (llm.budgets; a 200-350-word narrative is ~470 "
        "tokens)."))
    temperature: TEMPERATURE = Field(0.1, description=(
        "Sampling as the reference synthesises (temperature 0.1, top_p 0.1; see extract)."))
    top_p: TOP_P = Field(0.1, description=(
        "Nucleus mass of the same sampling (see temperature)."))
    # The checkout's synthesis prompt.
    reference_dir: Annotated[str | None, External("prompts.sources.lightmem")] = None


@dataclass(frozen=True)
class WindowPlan:
    window: Window
    buffer_ids: tuple[str, ...]  # time order
    seed_ids: tuple[str, ...]  # rank order (best first)
    context_ids: tuple[str, ...]  # reconstructed events, time order
    request: LLMRequest


@dataclass(frozen=True)
class SynthesisRow:
    synth_id: str
    conv_id: str
    window_index: int
    window_start: datetime
    window_end: datetime
    text: str
    buffer_entry_ids: tuple[str, ...]
    seed_entry_ids: tuple[str, ...]
    context_entry_ids: tuple[str, ...]
    request_id: str
    prompt_version: str
    parse_ok: bool


@dataclass(frozen=True)
class ConversationView:
    """One conversation's entries in consolidation order, with aligned vectors."""

    conv_id: str
    rows: pl.DataFrame
    matrix: np.ndarray
    windows: list[Window]


def _all_records(rows: pl.DataFrame) -> list[synthesis.Record]:
    """Every row as a prompt record, once per conversation: windows then pick by position
    (a polars row gather per window copied the embedding column each time: 1.2 ms a window)."""
    cols = [rows[c].to_list() for c in ("event_time", "speaker", "kind", "text")]
    return list(map(synthesis.Record, *cols))


def conversation_views(
    entries: pl.DataFrame, emb: pl.DataFrame, window_seconds: float
) -> list[ConversationView]:
    with_vectors = attach_embeddings(entries, "entry_id", emb, "entry_embeddings")
    out = []
    for conv_id, (rows, wins) in windows_by_conversation(with_vectors, window_seconds).items():
        out.append(ConversationView(conv_id, rows, embedding_matrix(rows), wins))
    return out


def query_vectors(
    ctx: StageContext, views: Sequence[ConversationView], mode: str
) -> list[np.ndarray]:
    """(windows, d) query matrix per conversation; `concat` encodes all windows in one call."""
    if mode == "mean":
        out = []
        for v in views:
            q = (
                np.stack([v.matrix[w.start : w.end].mean(axis=0) for w in v.windows])
                if v.windows
                else v.matrix[:0]
            )
            out.append(q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12))
        return out
    texts = ["\n".join(v.rows["text"][w.start : w.end].to_list()) for v in views for w in v.windows]
    # Encoded as memory text (use="entry"), as the reference embeds it with the entries' own
    # encoder call: the joined buffer is a memory, not a question, so no query instruction.
    flat = ctx.encode(texts, use="entry") if texts else np.zeros((0, 0), dtype=np.float32)
    sizes = np.cumsum([0, *(len(v.windows) for v in views)])
    return [flat[a:b] for a, b in itertools.pairwise(sizes)]


def plan_conversation(
    view: ConversationView, queries: np.ndarray, s: ConsolidateSettings
) -> list[WindowPlan]:
    ids = view.rows["entry_id"].to_list()
    events = view.rows["event_id"].to_list()
    records = _all_records(view.rows)
    by_event = event_index(events)
    scores = queries @ view.matrix.T if view.windows else np.zeros((0, len(ids)), dtype=np.float32)
    if s.reference_dir is not None:
        from structmem_gpu.methods.structmem.prompts import reference

        version = reference.version(s.reference_dir, "synthesis")
        texts = reference.used_texts(s.reference_dir, ["synthesis"])  # read once, not per window
    else:
        version = synthesis.prompt_version(s.prompt_variant)
    # Each entry rendered once for the conversation (it is listed in ~20 windows' prompts).
    lines = synthesis.lines(records) if s.reference_dir is None else []
    out = []
    for w, row_scores in zip(view.windows, scores, strict=True):
        pool = seed_pool(w, len(ids), s.seed_scope, s.seed_exclude_buffer)
        seeds = top_k_in_pool(row_scores, pool, s.seed_k)
        context = reconstruct_events(seeds, events, w, by_event)
        buffer_recs = records[w.start : w.end]
        if s.reference_dir is not None:
            messages = reference.reference_synthesis_messages(
                s.reference_dir, buffer_recs, [records[p] for p in context], texts
            )
        else:
            messages = synthesis.messages(s.prompt_variant, synthesis.user_message(
                buffer_recs, lines[w.start : w.end], [lines[p] for p in context]))
        rid = request_id(STAGE_NAME, view.conv_id, w.index, version, messages[-1].content)
        req = LLMRequest(
            request_id=rid,
            stage=STAGE_NAME,
            conv_id=view.conv_id,
            messages=messages,
            prompt_version=version,
            schema=None,  # free text: see methods/structmem/prompts/synthesis.py
            sampling=Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens),
        )
        out.append(
            WindowPlan(
                w,
                tuple(ids[w.start : w.end]),
                tuple(ids[p] for p in seeds),
                tuple(ids[p] for p in context),
                req,
            )
        )
    return out


def synthesis_row(plan: WindowPlan, result: LLMResult) -> SynthesisRow:
    w, text = plan.window, result.text.strip()
    sid = stable_hash("synthesis", w.conv_id, w.index, plan.request.request_id)
    return SynthesisRow(
        sid,
        w.conv_id,
        w.index,
        w.start_time,
        w.end_time,
        text,
        plan.buffer_ids,
        plan.seed_ids,
        plan.context_ids,
        plan.request.request_id,
        plan.request.prompt_version,
        bool(result.parse_ok and text),
    )


def syntheses_frame(rows: Sequence[SynthesisRow]) -> pl.DataFrame:
    return schemas.rows_frame(rows, schemas.SYNTHESES)


def _mean(values: Sequence[int]) -> float:
    return round(float(np.mean(values)), 2) if values else 0.0


def run_consolidate(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: ConsolidateSettings = ctx.settings
    empty = {
        "syntheses": schemas.empty(schemas.SYNTHESES),
        "synthesis_embeddings": schemas.empty(schemas.EMBEDDINGS),
    }
    ctx.notes["enabled"] = s.enabled
    if not s.enabled:
        ctx.notes.update(windows=0, requests=0)
        return empty
    entries, emb = ctx.read("entries"), ctx.read("entry_embeddings")
    views = conversation_views(entries, emb, s.window_seconds)
    before = encode_notes(ctx) if entries.height else None
    queries = query_vectors(ctx, views, s.query_mode)
    # The windows are planned as the client draws their requests, so the server starts on the
    # first conversation's while the rest are planned (llm/types.py); one batch either way.
    plans: list[WindowPlan] = []

    def planned() -> Iterator[LLMRequest]:
        for v, q in zip(views, queries, strict=True):
            for p in plan_conversation(v, q, s):
                plans.append(p)
                yield p.request

    # One BLAS thread while planning: the seed scores are one small product per conversation
    # (its windows x its entries), and after each one OpenBLAS's idle worker spins on the
    # other core: planning 24,845 LongMemEval-S-size windows took 9.7-9.9 s of CPU with two
    # threads against 4.7-5.5 s with one, for the same ~5.0 s of wall time (docs/performance.md,
    # "GPU-paced builds"). Nothing else uses BLAS while the batch is out.
    with one_thread("blas"):
        results = ctx.generate(planned(), desc="consolidate",
                               total=sum(len(v.windows) for v in views))  # one batch
    rows = [synthesis_row(p, r) for p, r in zip(plans, results, strict=True)]
    ok = [r for r in rows if r.parse_ok]
    emb_frame = empty["synthesis_embeddings"]
    if ok:
        mat = ctx.encode([r.text for r in ok])
        emb_frame = embeddings_frame(
            [r.synth_id for r in ok],
            [r.conv_id for r in ok],
            [r.text for r in ok],
            mat,
            ctx.encoder().model_id,
        )
    ctx.notes.update(
        conversations=len(views),
        windows=len(plans),
        requests=len(plans),
        parse_failures=sum(not r.parse_ok for r in rows),
        truncated=sum(r.finish_reason == "length" for r in results),
        buffer_entries_mean=_mean([len(p.buffer_ids) for p in plans]),
        seeds_mean=_mean([len(p.seed_ids) for p in plans]),
        context_entries_mean=_mean([len(p.context_ids) for p in plans]),
        syntheses_embedded=len(ok),
        **(encode_notes(ctx, before) if before is not None else {}),
    )
    log.info("consolidate: %s", ctx.notes)
    return {"syntheses": syntheses_frame(rows), "synthesis_embeddings": emb_frame}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

SYNTHESIS_COMPLETION = 450  # tokens of a 200-350-word narrative


def entry_stand_ins(inp: EstimateInputs, x: "ExtractSettings") -> pl.DataFrame:
    """The turns standing in for the entries of one perspective: per extraction window (the
    extract stage's own plan) its first `extract.expected_items` turns, as many as a reply
    is expected to hold (the extract hook's stand-in entries). Every session keeps a turn,
    so the synthesis windows stay the same."""
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.methods.structmem.extract import expected_items, plan_from_settings

    if x.max_items is None or x.input != "turns":
        return inp.turns
    try:
        windows, _ = plan_from_settings(inp.turns, x, inp.job.root.llm)
    except ConfigError:  # the window tokenizer is not here (the extract row says so)
        return inp.turns
    kept = {t.event_id for w in windows for t in w.turns[: expected_items(len(w.turns), x.max_items)]}
    return inp.turns.filter(pl.col("event_id").is_in(list(kept)))


def stand_in_synthesis(conv_id: str, index: int, buffer: Sequence[Any], s: ConsolidateSettings) -> dict[str, Any]:
    """A SYNTHESES row as long as the expected reply (min(max_tokens, 450) tokens), written
    with its buffer's words (for the dry run's readers)."""
    words = " ".join(r.text for r in buffer).split() or ["event"]
    chars = CHARS_PER_TOKEN * min(s.max_tokens, SYNTHESIS_COMPLETION)
    text = " ".join(words * (chars // max(len(" ".join(words)), 1) + 1))[:chars]
    times = [r.time for r in buffer if r.time is not None]
    return {"synth_id": f"{conv_id}:synth:{index}", "conv_id": conv_id, "window_index": index,
            "window_start": min(times, default=None), "window_end": max(times, default=None),
            "text": text, "buffer_entry_ids": [], "seed_entry_ids": [], "context_entry_ids": [],
            "request_id": "", "prompt_version": "", "parse_ok": True}


def stand_in_windows(inp: EstimateInputs, s: ConsolidateSettings) -> list[tuple[str, list[Any], list[Any]]]:
    """(conv_id, buffer records, seed-context records) of every window the stage plans: its
    greedy windows over the turns' times, with turns standing in for the entries (one per
    perspective for each turn an extraction reply can hold, `entry_stand_ins`) and the last
    seed_k of the seed pool as context (the ranking needs the encoder; the size is the
    prompt's). Shared with the consolidation audit's estimate."""
    from structmem_gpu.methods.structmem.extract import ExtractSettings

    x = inp.job.settings(ExtractSettings)
    kinds = list(x.perspectives)
    frame = entry_stand_ins(inp, x).rename({"session_time": "event_time"})
    out: list[tuple[str, list[Any], list[Any]]] = []
    for rows, wins in windows_by_conversation(frame, s.window_seconds).values():
        recs = [
            synthesis.Record(r["event_time"], r["speaker"], k, (r["text"] or "")[: x.max_item_chars])
            for r in rows.iter_rows(named=True)
            for k in kinds
        ]
        per = len(kinds)
        for w in wins:
            buffer = recs[w.start * per : w.end * per]
            pool = (recs[: w.start * per] if s.seed_scope == "historical"
                    else recs[: w.start * per] + recs[w.end * per :])
            if not s.seed_exclude_buffer:
                pool = pool + buffer
            out.append((str(rows["conv_id"][0]), buffer, pool[-s.seed_k * per :] if s.seed_k else []))
    return out


def estimate_consolidate(inp: EstimateInputs) -> StageEstimate:
    """The stage's greedy windows over the turns' times (entries inherit their turn's time),
    so the count is the stage's whenever every session yields an entry, else an upper bound;
    prompts of the real synthesis messages on `stand_in_windows`; completion
    min(max_tokens, 450)."""
    s = inp.job.settings(ConsolidateSettings)
    if not s.enabled:
        return StageEstimate(STAGE_NAME, 0, 0, 0, "consolidate.enabled=false", 0, build=True)
    prompt = n = over = 0
    synths: list[dict[str, Any]] = []
    for conv_id, buffer, context in stand_in_windows(inp, s):
        msgs = synthesis.build_messages(s.prompt_variant, buffer, context)
        prompt += inp.counter.messages(msgs)
        over += inp.over(msgs, s.max_tokens)
        n += 1
        synths.append(stand_in_synthesis(conv_id, len(synths), buffer, s))
    inp.stand_ins["syntheses"] = schemas.frame(synths, schemas.SYNTHESES)
    return StageEstimate(
        STAGE_NAME, n, prompt, n * min(s.max_tokens, SYNTHESIS_COMPLETION),
        "upper bound: greedy windows over turn times (the stage's count when every turn "
        "yields an entry); turns stand in for entries",
        over if inp.checked else None, bound=True, build=True,
    )


STAGE = Stage(
    name=STAGE_NAME,
    run=run_consolidate,
    reads=("entries", "entry_embeddings"),
    writes=("syntheses", "synthesis_embeddings"),
    settings=ConsolidateSettings,
    depends=(*EMBEDDER_IDENTITY, *LLM_IDENTITY),
    version="2",  # 2: the seed query is encoded as an entry (no query instruction)
    extra_fingerprint=lambda job: texts_fingerprint(
        job.settings(ConsolidateSettings).reference_dir, ["synthesis"]),
    uses=("llm", "encoder"),
    estimate=estimate_consolidate,
)
