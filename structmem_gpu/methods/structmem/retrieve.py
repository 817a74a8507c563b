"""Stage `retrieve`: dual-circuit retrieval (paper A.3;
docs/methods.md "StructMem: reader").

    python jobs/run.py benchmark=sample method=structmem stages=[retrieve] retrieve.entries_k=30

All selected questions (`benchmark.categories`) are embedded in one encoder call. Per
conversation, one in-memory FAISS flat inner-product index over its entries and one over its
syntheses (when the syntheses tables exist); each is searched once with all of that
conversation's questions. A question only ever sees its own conversation's memory. One row
per (question, circuit, rank):

    {"question_id": "sample-1:q0", "conv_id": "sample-1", "circuit": "entries", "rank": 0,
     "item_id": "3f0c9a1be2d47c55", "score": 0.7312}

ctx.notes: questions, conversations, rows_entries, rows_syntheses, questions_without_entries,
index_on_gpu, search_s, and the encoder counters (embedded_new, cache_hits, embed_s,
embeddings_per_s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import Field

import numpy as np
import polars as pl
from tqdm import tqdm

from structmem_gpu.core import schemas
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.index.faiss_index import VectorIndex
from structmem_gpu.methods.structmem.embed import embedding_matrix, encode_notes
from structmem_gpu.methods.structmem.update_view import deleted_ids, keeps_syntheses, view_fingerprint
from structmem_gpu.config.settings import COUNT, Settings, YamlExpr
from structmem_gpu.stage import EMBEDDER_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

CIRCUITS = ("entries", "syntheses")


def _by_conversation(emb: pl.DataFrame | None) -> dict[str, tuple[list[str], np.ndarray]]:
    """conv_id -> (item ids, matrix) of an EMBEDDINGS frame."""
    if emb is None or emb.height == 0:
        return {}
    out = {}
    for (conv_id,), part in emb.group_by("conv_id", maintain_order=True):
        out[str(conv_id)] = (part["item_id"].to_list(), embedding_matrix(part))
    return out


def _memory_ids(
    table: pl.DataFrame | None, id_col: str, extra: pl.Expr | None = None
) -> set[str] | None:
    """Ids present in the memory table (embeddings of deleted rows must not be retrieved)."""
    if table is None:
        return None
    if extra is not None:
        table = table.filter(extra)
    return set(table[id_col].to_list())


def _restrict(
    pool: dict[str, tuple[list[str], np.ndarray]], keep: set[str] | None
) -> dict[str, tuple[list[str], np.ndarray]]:
    if keep is None:
        return pool
    out = {}
    for conv, (ids, mat) in pool.items():
        mask = np.fromiter((i in keep for i in ids), dtype=bool, count=len(ids))
        out[conv] = ([i for i, m in zip(ids, mask, strict=True) if m], mat[mask])
    return out


def search_rows(
    circuit: str,
    qids: Sequence[str],
    conv_id: str,
    queries: np.ndarray,
    pool: tuple[list[str], np.ndarray] | None,
    k: int,
    index_cfg: dict[str, Any],
    on_gpu: set[bool] | None = None,
) -> list[dict[str, Any]]:
    """RETRIEVALS rows for one conversation's questions against one circuit's memory."""
    if pool is None or k <= 0 or not pool[0]:
        return []
    index = VectorIndex(pool[0], pool[1], **index_cfg)
    if on_gpu is not None:
        on_gpu.add(index.on_gpu)
    rows = []
    for qid, hits in zip(qids, index.search(queries, k), strict=True):
        rows.extend(
            {
                "question_id": qid,
                "conv_id": conv_id,
                "circuit": circuit,
                "rank": r,
                "item_id": item,
                "score": score,
            }
            for r, (item, score) in enumerate(hits)
        )
    return rows


class RetrieveSettings(Settings):
    """`retrieve:` of conf/method/structmem.yaml (paper A.3: 60 entries + 5 syntheses); the
    block is generated from these fields and turn_rag's TurnRetrieveSettings."""

    node: ClassVar[str] = "retrieve"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    entries_k: Annotated[COUNT, YamlExpr("${llm_or:budgets.reader_entries_k,60}")] = Field(60, description=(
        "Entries per question. Reader context per question: paper A.3 (60 entries + 5 "
        "syntheses) unless the LLM profile caps it (llm.budgets.reader_*: the CPU profile's 135M "
        "model reads ~140 prompt tokens/s). The replication experiments pin 60/5 whatever the "
        "profile."))
    syntheses_k: Annotated[COUNT, YamlExpr("${llm_or:budgets.reader_syntheses_k,5}")] = Field(5, description="Syntheses per question (paper A.3).")


def run_retrieve(ctx: StageContext) -> dict[str, pl.DataFrame]:
    job, s = ctx.job, ctx.settings
    questions = selected_questions(job, ctx.read("questions"))
    ks = {"entries": s.entries_k, "syntheses": s.syntheses_k}
    index_cfg = {
        "use_gpu": job.root.index.use_gpu,
        "gpu_max_k": job.root.index.gpu_max_k,
    }
    syntheses = ctx.read_optional("syntheses")
    # update.read=post (update_view.py): deleted entries leave retrieval, and the syntheses
    # too unless update.post_syntheses; pre (default) reads the store as built.
    gone = deleted_ids(job, ctx.read_optional("entry_updates"))
    pools = {
        "entries": _restrict(
            _by_conversation(ctx.read("entry_embeddings")),
            _memory_ids(ctx.read("entries"), "entry_id",
                        ~pl.col("entry_id").is_in(sorted(gone)) if gone else None),
        ),
        "syntheses": _restrict(
            _by_conversation(ctx.read_optional("synthesis_embeddings")),
            _memory_ids(syntheses, "synth_id", pl.col("parse_ok")),
        ) if keeps_syntheses(job) else {},
    }
    before = encode_notes(ctx) if questions.height else None
    qmat = ctx.encode(questions["question"].to_list(), use="query") if questions.height else None
    rows: list[dict[str, Any]] = []
    on_gpu: set[bool] = set()
    t0 = time.perf_counter()
    groups = list(questions.with_row_index("_pos").group_by("conv_id", maintain_order=True))
    for (conv_id,), part in tqdm(groups, desc="retrieve", unit="conv", disable=len(groups) < 50):
        qids, qvec = part["question_id"].to_list(), qmat[part["_pos"].to_numpy()]
        for circuit in CIRCUITS:
            rows.extend(
                search_rows(
                    circuit,
                    qids,
                    str(conv_id),
                    qvec,
                    pools[circuit].get(str(conv_id)),
                    ks[circuit],
                    index_cfg,
                    on_gpu,
                )
            )
    search_s = time.perf_counter() - t0
    ctx.index_wall_s += search_s  # FAISS build + search: not framework overhead
    out = schemas.frame(rows, schemas.RETRIEVALS)
    hit_q = set(out.filter(pl.col("circuit") == "entries")["question_id"].to_list())
    ctx.notes.update(
        questions=questions.height,
        conversations=len(groups),
        index_on_gpu=any(on_gpu),
        search_s=round(search_s, 3),
        rows_entries=int((out["circuit"] == "entries").sum()),
        rows_syntheses=int((out["circuit"] == "syntheses").sum()),
        questions_without_entries=questions.height - len(hit_q),
        **(encode_notes(ctx, before) if before is not None else {}),
    )
    log.info("retrieve: %s", ctx.notes)
    return {"retrievals": out}


def estimate_retrieve(inp: EstimateInputs) -> StageEstimate:
    """No LLM. Leaves stand-in retrievals for the reader's prompts: per selected question
    the first entries_k stand-in entries and syntheses_k syntheses of its conversation (the
    ranking needs the encoder; the count and the lengths are what the prompt holds)."""
    s = inp.job.settings(RetrieveSettings)
    pools = {"entries": inp.stand_ins.get("entries"), "syntheses": inp.stand_ins.get("syntheses")}
    ids = {"entries": "entry_id", "syntheses": "synth_id"}
    ks = {"entries": s.entries_k, "syntheses": s.syntheses_k}
    rows: list[dict[str, Any]] = []
    for circuit in CIRCUITS:
        pool = pools.get(circuit)
        if pool is None or not ks[circuit]:
            continue
        by_conv = {str(c): part[ids[circuit]].to_list()
                   for (c,), part in pool.group_by("conv_id", maintain_order=True)}
        for qid, conv in inp.selected.select("question_id", "conv_id").iter_rows():
            rows.extend({"question_id": qid, "conv_id": conv, "circuit": circuit, "rank": r,
                         "item_id": item, "score": 0.0}
                        for r, item in enumerate(by_conv.get(str(conv), [])[: ks[circuit]]))
    inp.stand_ins["retrievals"] = schemas.frame(rows, schemas.RETRIEVALS)
    return StageEstimate("retrieve", 0, 0, 0, "no LLM", 0)


STAGE = Stage(
    name="retrieve",
    run=run_retrieve,
    reads=("questions", "entries", "entry_embeddings"),
    optional_reads=("syntheses", "synthesis_embeddings", "entry_updates"),
    writes=("retrievals",),
    settings=RetrieveSettings,
    depends=("benchmark.categories", *EMBEDDER_IDENTITY),
    extra_fingerprint=view_fingerprint,  # None unless update.read=post
    uses=("encoder",),
    estimate=estimate_retrieve,
    loads=("faiss",),
)
