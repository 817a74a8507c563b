"""turn_rag baseline: no LLM at build time; retrieve raw turns, answer from them.

    python jobs/run.py method=turn_rag benchmark=sample retrieve.turns_k=20

Stage `embed` embeds every turn as `<date> <speaker>: <text> [image: <caption>]`
(prompts/answer_turn_rag.embed_text) into tables/turn_embeddings (schemas.EMBEDDINGS,
item_id = the turn's event_id). Stage `retrieve` searches, per conversation, the top
`retrieve.turns_k` turns for every selected question (circuit "turns", item_id = event_id, so
evidence recall counts them directly). The reader (`answer.prompt: turn_rag`) sees those turns
in time order with their date and speaker. One retrievals row:

    {"question_id": "sample-1:q0", "conv_id": "sample-1", "circuit": "turns", "rank": 0,
     "item_id": "sample-1:D2:1", "score": 0.6132}

The only LLM requests of the method are the answer and judge batches.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from pydantic import Field

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.data import display_text
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.methods.structmem.embed import (
    embedding_matrix,
    embeddings_frame,
    encode_notes,
)
from structmem_gpu.methods.structmem.retrieve import search_rows
from structmem_gpu.methods.baselines.prompts import answer_turn_rag as P
from structmem_gpu.config.settings import COUNT, Settings
from structmem_gpu.stage import EMBEDDER_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

PROMPT_NAME = "turn_rag"
CIRCUIT = "turns"
TABLE = "turn_embeddings"


def turn_texts(turns: pl.DataFrame) -> list[str]:
    return [
        P.embed_text(t, speaker, display_text(text or "", caption))
        for t, speaker, text, caption in turns.select(
            "session_time", "speaker", "text", "image_caption"
        ).iter_rows()
    ]


def run_embed_turns(ctx: StageContext) -> dict[str, pl.DataFrame]:
    turns = ctx.read("turns").sort("conv_id", "session_index", "turn_index")
    if turns.height == 0:
        ctx.notes.update(embeddings=0)
        return {TABLE: schemas.empty(schemas.EMBEDDINGS)}
    before = encode_notes(ctx)
    texts = turn_texts(turns)
    matrix = ctx.encode(texts)
    enc = ctx.encoder()
    ctx.notes.update(
        embeddings=len(texts), model=enc.model_id, dim=enc.dim, **encode_notes(ctx, before)
    )
    frame = embeddings_frame(
        turns["event_id"].to_list(), turns["conv_id"].to_list(), texts, matrix, enc.model_id
    )
    return {TABLE: frame}


def _pools(emb: pl.DataFrame) -> dict[str, tuple[list[str], np.ndarray]]:
    return {
        str(conv): (part["item_id"].to_list(), embedding_matrix(part))
        for (conv,), part in emb.group_by("conv_id", maintain_order=True)
    }


class TurnRetrieveSettings(Settings):
    """`retrieve:` of conf/method/turn_rag.yaml (hand-written there); its default is generated
    into StructMem's `retrieve:` block, which every method inheriting it reads."""

    node: ClassVar[str] = "retrieve"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    turns_k: COUNT = Field(20, description=(
        "Raw turns per question (turn_rag baseline only)."))


def run_retrieve_turns(ctx: StageContext) -> dict[str, pl.DataFrame]:
    job = ctx.job
    questions = selected_questions(job, ctx.read("questions"))
    k = ctx.settings.turns_k
    index_cfg = {
        "use_gpu": job.root.index.use_gpu,
        "gpu_max_k": job.root.index.gpu_max_k,
    }
    pools = _pools(ctx.read(TABLE))
    before = encode_notes(ctx) if questions.height else None
    qmat = ctx.encode(questions["question"].to_list(), use="query") if questions.height else None
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for (conv,), part in questions.with_row_index("_pos").group_by("conv_id", maintain_order=True):
        qvec = qmat[part["_pos"].to_numpy()]  # type: ignore[index]
        rows.extend(
            search_rows(
                CIRCUIT,
                part["question_id"].to_list(),
                str(conv),
                qvec,
                pools.get(str(conv)),
                k,
                index_cfg,
            )
        )
    search_s = time.perf_counter() - t0
    ctx.index_wall_s += search_s  # FAISS build + search: not framework overhead
    out = schemas.frame(rows, schemas.RETRIEVALS)
    ctx.notes.update(
        questions=questions.height,
        turns_k=k,
        rows=out.height,
        search_s=round(search_s, 3),
        **(encode_notes(ctx, before) if before is not None else {}),
    )
    log.info("turn_rag retrieve: %s", ctx.notes)
    return {"retrievals": out}


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    """The retrieved turns of each question, in conversation order, dated."""
    retrievals = inputs.require("retrievals", PROMPT_NAME)
    turns = inputs.require("turns", PROMPT_NAME)
    hits = retrievals.filter(
        (pl.col("circuit") == CIRCUIT)
        & pl.col("question_id").is_in(inputs.questions["question_id"].to_list())
    )
    joined = hits.join(
        turns.select(
            pl.col("event_id").alias("item_id"),
            "session_index",
            "turn_index",
            "session_time",
            "speaker",
            "text",
            "image_caption",
        ),
        on="item_id",
        how="inner",
    ).sort("question_id", "session_index", "turn_index")
    lines: dict[str, list[P.TurnLine]] = {}
    for qid, t, speaker, text, caption in joined.select(
        "question_id", "session_time", "speaker", "text", "image_caption"
    ).iter_rows():
        lines.setdefault(qid, []).append(P.TurnLine(t, speaker, display_text(text or "", caption)))
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        out[qid] = AnswerPrompt(P.build_messages(question, lines.get(qid, []), now), P.VERSION)
    return out



def estimate_retrieve_turns(inp: EstimateInputs) -> StageEstimate:
    """No LLM. Leaves stand-in retrievals for the reader's prompts: per selected question the
    first turns_k turns of its conversation (the ranking needs the encoder)."""
    k = inp.job.settings(TurnRetrieveSettings).turns_k
    by_conv = {str(c): part.sort("session_index", "turn_index")["event_id"].to_list()
               for (c,), part in inp.turns.group_by("conv_id", maintain_order=True)}
    rows = [{"question_id": qid, "conv_id": conv, "circuit": CIRCUIT, "rank": r, "item_id": item,
             "score": 0.0}
            for qid, conv in inp.selected.select("question_id", "conv_id").iter_rows()
            for r, item in enumerate(by_conv.get(str(conv), [])[:k])]
    inp.stand_ins["retrievals"] = schemas.frame(rows, schemas.RETRIEVALS)
    return StageEstimate("retrieve", 0, 0, 0, "no LLM", 0)


EMBED_STAGE = Stage(
    name="embed", run=run_embed_turns, reads=("turns",), writes=(TABLE,), depends=EMBEDDER_IDENTITY,
    uses=("encoder",),
)
RETRIEVE_STAGE = Stage(
    name="retrieve",
    run=run_retrieve_turns,
    reads=("questions", TABLE),
    writes=("retrievals",),
    settings=TurnRetrieveSettings,
    depends=("benchmark.categories", *EMBEDDER_IDENTITY),
    uses=("encoder",),
    estimate=estimate_retrieve_turns,
    loads=("faiss",),
)
