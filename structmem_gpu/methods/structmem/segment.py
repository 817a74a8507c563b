"""Stage `segment`: the reference's topic segmentation and 512-token extraction batches
(LightMem 8fc9a91 `topic_segment: true`; the rules are in methods/structmem/segmenting.py,
docs/methods.md "Compression and topic segmentation").

    python jobs/run.py experiment=structmem_locomo_reference_code stages=[load,compress,segment]

Reads the compressed turns (the reference segments what it compressed, with the same
LLMLingua-2 model). Every conversation's sensory buffer advances to its next cut; the cuts
pending in all conversations are then computed together: one batched attention pass of the
compression model (`segment.batch_size` buffers per forward, layers `segment.layers`
averaged) and one encoder call for the adjacent-turn cosines; then all resume. With
`extract.input=segments` the extraction windows are these batches (cross-session ones too).

    tables/segments.parquet: one row per topic segment (schemas.SEGMENTS)

ctx.notes: segments, batches, cuts (buffer cuts computed), attention_passes, reasons (count per
reason), lost_turns (turns of segments the reference's forced last cut overwrites),
cross_session_batches, batch_tokens_mean.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.methods.structmem import segmenting as S
from structmem_gpu.methods.structmem.compress import (
    approximate_compressed,
    o200k_or_chars,
    resolve_device,
    tokenizer_data_fingerprint,
)
from structmem_gpu.methods.structmem.segment_settings import SegmentSettings
from structmem_gpu.stage import EMBEDDER_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

STAGE_NAME = "segment"


class AttentionSignal:
    """Boundaries from the compression model's inter-sentence attention, many buffers per
    forward pass (right-padded, masked: each row sees only its own tokens)."""

    def __init__(self, model: Any, tokenizer: Any, layers: tuple[int, ...], batch_size: int) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.layers, self.batch_size = layers, batch_size
        self.passes = 0

    def boundaries(self, buffers: list[tuple[str, ...]]) -> list[list[int]]:
        import torch  # loaded with the model already

        tok = self.tokenizer
        cls_id = tok.cls_token_id if tok.cls_token_id is not None else tok.convert_tokens_to_ids("[CLS]")
        sep_id = tok.sep_token_id if tok.sep_token_id is not None else tok.convert_tokens_to_ids("[SEP]")
        items = []
        for texts in buffers:
            ids, spans, cur = [cls_id], [], 1
            for text in texts:
                piece = tok.encode(text, add_special_tokens=False)
                ids.extend(piece)
                spans.append((cur, cur + len(piece)))
                cur += len(piece)
            ids.append(sep_id)
            items.append((ids, spans))
        device = next(self.model.parameters()).device
        out: list[list[int]] = []
        for start in range(0, len(items), self.batch_size):
            part = items[start : start + self.batch_size]
            width = max(len(ids) for ids, _ in part)
            pad = tok.pad_token_id or 0
            ids_t = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in part], device=device)
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in part],
                                device=device)
            with torch.no_grad():
                att = self.model(ids_t, attention_mask=mask, output_attentions=True,
                                 return_dict=True).attentions
            self.passes += 1
            mean = torch.stack([att[i] for i in self.layers], dim=0).mean(dim=(0, 2)).float().cpu().numpy()
            for row, (ids, spans) in enumerate(part):
                n = len(ids)
                out.append(S.attention_boundaries(S.sentence_attention(mean[row, :n, :n], spans)))
        return out


def eager_attention(model: Any) -> None:
    """Attention weights need the eager implementation (SDPA returns none)."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter("eager")
    else:
        model.config._attn_implementation = "eager"


def plan_rows(conv_id: str, plan: S.ConversationPlan, event_ids: list[str], sessions: list[int],
              model_tokens: Any, count: Any) -> list[dict[str, Any]]:
    batch_tokens = {b: sum(count(" ".join(plan.segments[i].user_texts)) for i in seg_ids)
                    for b, seg_ids in enumerate(plan.batches)}
    batch_sessions = {b: len({sessions[t] for i in seg_ids for t in plan.segments[i].turns})
                      for b, seg_ids in enumerate(plan.batches)}
    return [
        {
            "conv_id": conv_id, "segment_index": k,
            "event_ids": [event_ids[t] for t in seg.turns], "reason": seg.reason,
            "released_at": event_ids[seg.released_at],
            "model_tokens": sum(model_tokens(x) for x in seg.user_texts),
            "tokens": count(" ".join(seg.user_texts)),
            "batch_index": seg.batch,
            "batch_released_at": (event_ids[seg.batch_call] if seg.batch_call is not None
                                  else None),
            "batch_tokens": batch_tokens.get(seg.batch) if seg.batch is not None else None,
            "batch_sessions": batch_sessions.get(seg.batch) if seg.batch is not None else None,
        }
        for k, seg in enumerate(plan.segments)
    ]


def run_segment(ctx: StageContext) -> dict[str, pl.DataFrame]:
    from tqdm.auto import tqdm

    from structmem_gpu.llm.tiktoken_data import o200k_counter
    from structmem_gpu.methods.structmem.lingua import Lingua, release

    s: SegmentSettings = ctx.settings
    comp = ctx.read("compressed_turns").sort("conv_id", "session_index", "turn_index")
    lingua = Lingua(s.model, resolve_device(s.device), s.batch_size)
    eager_attention(lingua.model)
    signal = AttentionSignal(lingua.model, lingua.tokenizer, s.layers, s.batch_size)
    count = o200k_counter()
    convs: dict[str, Any] = {}
    meta: dict[str, tuple[list[str], list[int]]] = {}
    for (conv_id,), frame in comp.group_by("conv_id", maintain_order=True):
        texts = frame["compressed"].to_list()
        meta[str(conv_id)] = (frame["event_id"].to_list(), frame["session_index"].to_list())
        convs[str(conv_id)] = S.conversation_plan(texts, lingua.model_tokens, count,
                                                   s.buffer_tokens, s.batch_tokens)
    bar = tqdm(desc="segment cuts", unit="cut", mininterval=1.0)

    def signals(needs: list[S.CutNeed]) -> list[S.CutSignals]:
        cuts = signal.boundaries([n.texts for n in needs])
        flat = [t for n in needs for t in n.turn_texts]
        vecs = np.asarray(ctx.encode(flat), dtype=np.float32) if flat else np.zeros((0, 1), np.float32)
        out, at = [], 0
        for n, c in zip(needs, cuts, strict=True):
            k = len(n.turn_texts)
            out.append(S.CutSignals(tuple(c), vecs[at : at + k] if k else None))
            at += k
        bar.update(len(needs))
        return out

    try:
        plans = S.run_plans(convs, signals)
    finally:
        bar.close()
    rows = []
    for conv_id, plan in plans.items():
        event_ids, sessions = meta[conv_id]
        rows += plan_rows(conv_id, plan, event_ids, sessions, lingua.model_tokens, count)
    release(lingua)
    table = schemas.frame(rows, schemas.SEGMENTS)
    batches = table.filter(pl.col("batch_index").is_not_null()).unique(["conv_id", "batch_index"])
    ctx.notes.update(
        segments=table.height,
        batches=batches.height,
        cuts=sum(p.cuts for p in plans.values()),
        attention_passes=signal.passes,
        reasons=dict(Counter(table["reason"].to_list())),
        lost_turns=int(table.filter(pl.col("reason") == S.LOST)["event_ids"].list.len().sum() or 0),
        cross_session_batches=int((batches["batch_sessions"] > 1).sum()),
        batch_tokens_mean=round(float(batches["batch_tokens"].mean() or 0), 1),
    )
    log.info("segment: %s", ctx.notes)
    return {"segments": table}


def estimate_segment(inp: EstimateInputs) -> StageEstimate:
    """No LLM: the extraction batches, APPROXIMATE (each turn stands in for a topic segment,
    compressed by its first `compress.rate` share of words; the real cuts need the model)."""
    from structmem_gpu.methods.structmem.extract import approximate_batches

    s = inp.job.settings(SegmentSettings)
    batches = approximate_batches(approximate_compressed(inp.job, inp.turns), s.batch_tokens,
                                  o200k_or_chars()[0])
    cross = sum(len({t.session_index for t in w.turns}) > 1 for w in batches)
    return StageEstimate(STAGE_NAME, 0, 0, 0,
                         f"no LLM: APPROXIMATE {len(batches):,} extraction batches ({cross:,} "
                         "spanning sessions; turns standing in for topic segments)", 0)


STAGE = Stage(
    name=STAGE_NAME,
    run=run_segment,
    reads=("compressed_turns",),
    writes=("segments",),
    settings=SegmentSettings,
    version="2",  # 2: batch_released_at (batches one add_memory call sends share their numbering)
    depends=EMBEDDER_IDENTITY,
    extra_fingerprint=tokenizer_data_fingerprint,
    uses=("encoder",),
    estimate=estimate_segment,
    loads=("compression_model",),  # the segmenter shares compress.model
)
