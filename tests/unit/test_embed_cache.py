"""Embedding cache: concurrent writers (separate processes) on one SQLite file lose nothing."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np

from structmem_gpu.embed.cache import EmbeddingCache, text_sha


def _writer(root: str, worker: int, n: int) -> None:
    cache = EmbeddingCache(Path(root))
    for batch in range(5):
        keys = [text_sha(f"{worker}-{batch}-{i}") for i in range(n)]
        # Overlapping keys across workers too: INSERT OR IGNORE must not fail on them.
        keys.append(text_sha(f"shared-{batch}"))
        mat = np.full((len(keys), 4), worker + 1, dtype=np.float32)
        cache.put_many("ns", keys, mat)
    cache.close()


def test_concurrent_writers(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 50)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = EmbeddingCache(tmp_path)
    keys = [text_sha(f"{w}-{b}-{i}") for w in range(3) for b in range(5) for i in range(50)]
    keys += [text_sha(f"shared-{b}") for b in range(5)]
    got = cache.get_many("ns", keys)
    assert len(got) == len(keys)
    assert all(got[text_sha(f"2-4-{i}")][0] == 3.0 for i in range(50))
