"""`jobs/bench.py components`: encoder, FAISS and Parquet throughput, each on its own.

    python jobs/bench.py components                       # CPU; CUDA / FAISS-GPU rows when present
    python jobs/bench.py components embedder.batch_size=256

- encoder: embeddings/s of the configured encoder (conf/embedder) on CPU, and on CUDA when
  torch sees a GPU; unique synthetic turn texts, no cache, after a warm-up batch.
- faiss: per-conversation flat IP indexes (the retrieve stage's layout): build vectors/s and
  query throughput (queries/s at k = retrieve.entries_k) on CPU, and on GPU when FAISS-GPU is
  installed and sees a device.
- parquet: write/read rows/s and MB/s of an entries table (schemas.ENTRIES) with the run
  directory's own atomic writer (zstd).
"""

from __future__ import annotations

import logging
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.bench.fit import rate
from structmem_gpu.config.schema import EmbedderSettings

log = logging.getLogger(__name__)


def synthetic_texts(n: int) -> list[str]:
    """n distinct, realistic-length sentences (the generator's turn texts, numbered)."""
    from structmem_gpu.bench.synthetic import SyntheticSpec, generate_locomo

    per_conv = 24
    spec = SyntheticSpec(conversations=max(1, -(-n // per_conv)), sessions=4, turns_per_session=6)
    texts = [
        t["text"]
        for rec in generate_locomo(spec)
        for k, v in rec["conversation"].items()
        if k.startswith("session_") and isinstance(v, list)
        for t in v
    ]
    return [f"{t} (note {i})" for i, t in enumerate(texts[:n])]


def encoder_throughput(embedder: EmbedderSettings, n: int) -> list[dict[str, Any]]:
    """One row per device (cpu, and cuda when available): load time and embeddings/s."""
    import torch

    from structmem_gpu.embed.encoder import open_encoder

    texts = synthetic_texts(n)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        t0 = time.perf_counter()
        enc = open_encoder(embedder.model_copy(update={"device": device}), cache_dir=None)
        load = time.perf_counter() - t0
        enc.encode([f"warm-up {i}" for i in range(min(32, n))])
        t0 = time.perf_counter()
        mat = enc.encode(texts)
        wall = time.perf_counter() - t0
        rows.append(
            {
                "device": device,
                "model": enc.model_id,
                "texts": len(texts),
                "dim": int(mat.shape[1]),
                "batch_size": enc.batch_size,
                "load_s": round(load, 3),
                "wall_s": round(wall, 3),
                "embeddings_per_s": rate(len(texts), wall),
            }
        )
    return rows


def faiss_throughput(
    conversations: int, per_conv: int, dim: int, queries_per_conv: int, k: int, seed: int = 0
) -> list[dict[str, Any]]:
    """Build all per-conversation indexes, then query each; one row per device."""
    from structmem_gpu.index.faiss_index import VectorIndex, gpu_available

    rng = np.random.default_rng(seed)

    def unit(rows: int) -> np.ndarray:
        m = rng.standard_normal((rows, dim)).astype(np.float32)
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    data = [unit(per_conv) for _ in range(conversations)]
    queries = [unit(queries_per_conv) for _ in range(conversations)]
    ids = [[f"c{c}-e{i}" for i in range(per_conv)] for c in range(conversations)]
    rows = []
    for use_gpu in [False] + ([True] if gpu_available() else []):
        t0 = time.perf_counter()
        indexes = [VectorIndex(ids[c], data[c], use_gpu=use_gpu) for c in range(conversations)]
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        hits = sum(len(h) for c, ix in enumerate(indexes) for h in ix.search(queries[c], k))
        search = time.perf_counter() - t0
        nq = conversations * queries_per_conv
        rows.append(
            {
                "device": "gpu" if use_gpu else "cpu",
                "indexes": conversations,
                "vectors_per_index": per_conv,
                "dim": dim,
                "k": k,
                "queries": nq,
                "hits": hits,
                "build_s": round(build, 4),
                "build_vectors_per_s": rate(conversations * per_conv, build),
                "search_s": round(search, 4),
                "queries_per_s": rate(nq, search),
            }
        )
    return rows


def entries_frame(n: int) -> pl.DataFrame:
    """An entries table of n rows with realistic text (schemas.ENTRIES)."""
    from structmem_gpu.core import schemas

    texts = synthetic_texts(min(n, 5000))
    t0 = datetime(2023, 5, 8, 13, 56)
    return pl.DataFrame(
        {
            "entry_id": [f"{i:016x}" for i in range(n)],
            "conv_id": [f"conv-{i // 600}" for i in range(n)],
            "event_id": [f"conv-{i // 600}:D{i % 19 + 1}:{i % 23 + 1}" for i in range(n)],
            "dia_id": [f"D{i % 19 + 1}:{i % 23 + 1}" for i in range(n)],
            "session_index": [i % 19 + 1 for i in range(n)],
            "turn_index": [i % 23 for i in range(n)],
            "event_time": [t0 + timedelta(days=i % 300) for i in range(n)],
            "speaker": ["Caroline" if i % 2 else "Melanie" for i in range(n)],
            "kind": ["fact" if i % 2 else "relation" for i in range(n)],
            "text": [texts[i % len(texts)] for i in range(n)],
            "request_id": [f"extract:{i // 8:012x}" for i in range(n)],
            "prompt_version": ["factual/1"] * n,
            "model": ["smollm2|bench|"] * n,
        },
        schema=dict(schemas.ENTRIES),
    )


def parquet_throughput(n: int) -> dict[str, Any]:
    from structmem_gpu.core.artifacts import atomic_write_parquet

    df = entries_frame(n)
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        path = Path(tmp) / "entries.parquet"
        t0 = time.perf_counter()
        atomic_write_parquet(path, df)
        write = time.perf_counter() - t0
        size = path.stat().st_size
        t0 = time.perf_counter()
        back = pl.read_parquet(path, glob=False)
        read = time.perf_counter() - t0
    if back.height != n:
        raise RuntimeError(f"parquet round trip lost rows: {back.height} of {n}")
    mem_mb = df.estimated_size() / 1e6
    return {
        "rows": n,
        "file_mb": round(size / 1e6, 3),
        "in_memory_mb": round(mem_mb, 3),
        "write_s": round(write, 4),
        "write_rows_per_s": rate(n, write),
        "write_mb_per_s": rate(mem_mb, write),
        "read_s": round(read, 4),
        "read_rows_per_s": rate(n, read),
        "read_mb_per_s": rate(mem_mb, read),
    }


def run_components(
    embedder: EmbedderSettings,
    *,
    texts: int,
    conversations: int,
    per_conv: int,
    queries_per_conv: int,
    k: int,
    parquet_rows: int,
) -> dict[str, Any]:
    encoder = encoder_throughput(embedder, texts)
    dim = int(encoder[0]["dim"]) if encoder else 384
    return {
        "encoder": encoder,
        "faiss": faiss_throughput(conversations, per_conv, dim, queries_per_conv, k),
        "parquet": parquet_throughput(parquet_rows),
    }
