"""Response cache: SQLite (WAL) keyed by model, sampling, prompt version, schema and messages.

    cache = ResponseCache(Path(".cache/structmem_gpu"))      # -> llm_responses.sqlite
    llm = CachedBackend(HTTPBackend(...), cache)
    llm.generate(requests)   # first run: sends everything, writes each success as it lands
    llm.generate(requests)   # rerun: zero server calls, cache_hit=True, attempts=0

The key covers everything that changes a reply: the backend's `model_id` (served name + weights
path/id + revision: two models never share an entry), backend request extras, the sampling
parameters, the prompt version, the JSON schema and the exact messages. Only parse_ok results
are stored, so failures are re-sent next time. Several processes (a sweep's jobs) may write
the same file: WAL + busy_timeout, plus a retry loop on "database is locked".
Note: WAL needs a filesystem with working shared memory/locks (local disk, Lustre/GPFS with
locking); on plain NFS put `paths.cache_dir` on node-local or a lock-capable filesystem.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from structmem_gpu.hashing import canonical_json

# cache_key lives with the in-batch dedup (same key); importers of cache.cache_key still work
from structmem_gpu.llm.dedup import cache_key, send_distinct
from structmem_gpu.llm.structured import OnResult, check_reply
from structmem_gpu.llm.types import LLMBackend, LLMRequest, LLMResult

logger = logging.getLogger(__name__)

CACHE_FILE = "llm_responses.sqlite"
_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS responses (
    key               TEXT PRIMARY KEY,
    model             TEXT NOT NULL,
    prompt_version    TEXT NOT NULL,
    messages_hash     TEXT NOT NULL,
    messages          TEXT NOT NULL,   -- JSON list of {role, content}: messages from the hash
    schema            TEXT,            -- canonical JSON or NULL (free text)
    sampling          TEXT NOT NULL,
    text              TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens     INTEGER,
    finish_reason     TEXT NOT NULL,
    parse_ok          INTEGER NOT NULL,
    attempts          INTEGER NOT NULL,
    latency_s         REAL NOT NULL,
    created_at        REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_messages_hash ON responses (messages_hash);
"""
_COLUMNS = (
    "text",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "finish_reason",
    "parse_ok",
    "attempts",
    "latency_s",
)
_LOCK_RETRY_S = 120.0
T = TypeVar("T")


@dataclass(frozen=True)
class CachedReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    finish_reason: str
    parse_ok: bool
    attempts: int  # attempts the original computation took
    latency_s: float  # latency of the original computation


class ResponseCache:
    """One SQLite file under `cache_dir`, shared by every model, run and process."""

    def __init__(self, cache_dir: Path, *, busy_timeout_s: float = 30.0) -> None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.path = cache_dir / CACHE_FILE
        self._lock = threading.Lock()  # one connection, used from the client's loop thread too
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._retry(lambda: self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}"))
        self._retry(lambda: self._conn.execute("PRAGMA journal_mode=WAL"))
        # NORMAL under WAL: durable against a crash of this process; only power loss can lose
        # the last transactions, which a rerun recomputes.
        self._retry(lambda: self._conn.execute("PRAGMA synchronous=NORMAL"))
        self._retry(lambda: self._conn.executescript(_SCHEMA_SQL))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run `fn`, retrying while another process holds the write lock past busy_timeout."""
        deadline = time.monotonic() + _LOCK_RETRY_S
        delay = 0.05
        while True:
            try:
                with self._lock:
                    return fn()
            except sqlite3.OperationalError as e:
                msg = str(e).lower()
                if ("locked" not in msg and "busy" not in msg) or time.monotonic() > deadline:
                    raise
                logger.debug("response cache %s busy (%s); retrying", self.path, e)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _fetchall(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._conn.execute(sql, params).fetchall()

    def get_many(self, keys: Sequence[str]) -> dict[str, CachedReply]:
        found: dict[str, CachedReply] = {}
        uniq = list(dict.fromkeys(keys))
        for start in range(0, len(uniq), 500):  # stay under SQLite's host-parameter limit
            chunk = uniq[start : start + 500]
            sql = (
                f"SELECT key, {', '.join(_COLUMNS)} FROM responses "
                f"WHERE key IN ({', '.join('?' * len(chunk))})"
            )
            rows = self._retry(functools.partial(self._fetchall, sql, chunk))
            for key, text, p, c, cached, fin, ok, att, lat in rows:
                found[key] = CachedReply(text, p, c, cached, fin, bool(ok), att, lat)
        return found

    def put(self, key: str, req: LLMRequest, res: LLMResult) -> None:
        """Store one finished result (committed immediately: a crash keeps it)."""
        row = (
            key,
            res.model,
            req.prompt_version,
            res.messages_hash,
            canonical_json([m.as_dict() for m in req.messages]),
            None if req.schema is None else canonical_json(req.schema),
            canonical_json(asdict(req.sampling)),
            res.text,
            res.prompt_tokens,
            res.completion_tokens,
            res.cached_tokens,
            res.finish_reason,
            int(res.parse_ok),
            res.attempts,
            res.latency_s,
            time.time(),
        )
        sql = f"INSERT OR REPLACE INTO responses VALUES ({', '.join('?' * len(row))})"
        self._retry(lambda: self._conn.execute(sql, row))

    def messages_for(self, messages_hash: str) -> list[dict[str, str]] | None:
        """The full messages behind a `messages_hash` of requests.parquet (None if unknown)."""
        row = self._retry(
            lambda: self._conn.execute(
                "SELECT messages FROM responses WHERE messages_hash = ? LIMIT 1", (messages_hash,)
            ).fetchone()
        )
        return None if row is None else json.loads(row[0])

    def __len__(self) -> int:
        return int(
            self._retry(lambda: self._conn.execute("SELECT COUNT(*) FROM responses").fetchone())[0]
        )


def _hit_result(req: LLMRequest, hit: CachedReply, model: str) -> LLMResult:
    check = check_reply(hit.text, req.schema, hit.finish_reason)
    return LLMResult(
        request_id=req.request_id,
        text=hit.text,
        data=check.data if check.ok else None,
        parse_ok=check.ok,
        prompt_tokens=hit.prompt_tokens,
        completion_tokens=hit.completion_tokens,
        cached_tokens=hit.cached_tokens,
        latency_s=hit.latency_s,
        finish_reason=hit.finish_reason,
        cache_hit=True,
        attempts=0,
        messages_hash=req.messages_hash(),
        model=model,
        error=None if check.ok else check.error,
        salvaged=check.salvaged,
    )


class CachedBackend:
    """Wraps any backend: answers from the cache, sends only the misses (each distinct
    request once), and writes every successful result the moment it arrives."""

    def __init__(self, inner: LLMBackend, cache: ResponseCache) -> None:
        self.inner = inner
        self.cache = cache
        self.model_id = inner.model_id
        self.hits = 0
        self.misses = 0

    def __repr__(self) -> str:
        return f"CachedBackend({self.inner!r}, {self.cache.path})"

    def generate(
        self, requests: Sequence[LLMRequest], *, desc: str = "", on_result: OnResult | None = None
    ) -> list[LLMResult]:
        params = getattr(self.inner, "cache_params", {})
        keys = [cache_key(self.model_id, r, params) for r in requests]
        found = self.cache.get_many(keys)
        results: list[LLMResult | None] = [None] * len(requests)
        for i, (req, key) in enumerate(zip(requests, keys, strict=True)):
            if key in found:
                results[i] = _hit_result(req, found[key], self.model_id)
                if on_result is not None:
                    on_result(i, results[i])  # type: ignore[arg-type]
        logger.info(
            "%s: %d cached, %d to send (of %d)",
            desc or "llm",
            sum(k in found for k in keys),
            len({k for k in keys if k not in found}),
            len(requests),
        )

        def store(i: int, res: LLMResult) -> None:  # write-through: a crash loses no reply
            if res.parse_ok:
                self.cache.put(keys[i], requests[i], res)

        sent = send_distinct(
            self.inner, requests, keys, results, desc=desc, on_result=on_result, on_sent=store
        )
        self.hits += len(requests) - sent
        self.misses += sent
        return [r for r in results if r is not None]


def iter_rows(cache: ResponseCache, model: str | None = None) -> Iterable[dict[str, Any]]:
    """Every stored row (optionally of one model) as dicts; for notebooks and audits."""
    sql = "SELECT * FROM responses" + (" WHERE model = ?" if model else "")
    conn = cache._conn
    cur = cache._retry(lambda: conn.execute(sql, (model,) if model else ()))
    names = [d[0] for d in cur.description]
    for row in cache._retry(cur.fetchall):
        yield dict(zip(names, row, strict=True))
