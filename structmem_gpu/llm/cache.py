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
Writes go through one writer thread that commits whatever has arrived in one transaction
(a commit per reply cost ~0.2 ms, the largest item of the client's profile at 1,000 req/s);
a reply is on disk milliseconds after it lands, and `CachedBackend.generate` flushes before it
returns or raises, so a crash loses at most the replies of those last milliseconds.
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
from structmem_gpu.errors import StructMemError
from structmem_gpu.llm.dedup import KEY_VERSION, cache_key, send_distinct
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
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class CacheError(StructMemError):
    """The response cache file is damaged or was written by an incompatible version."""


def damaged_message(path: Path, err: Exception) -> str:
    return (f"{path}: response cache unreadable ({err}); move it aside and rerun "
            f"(mv {path} {path}.damaged; rm -f {path}-wal {path}-shm) — finished stages are kept, only their LLM replies "
            f"are recomputed when needed — or set cache.llm=false to run without it")
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
        # The write-behind queue: rows waiting for the writer thread (started on first put).
        self._cond = threading.Condition()
        self._queue: list[tuple[Any, ...]] = []
        self._unwritten = 0  # rows queued or being committed
        self._writer: threading.Thread | None = None
        self._closing = False
        self._error: BaseException | None = None
        self._check_key_format()
        # Read a page of the table now: a truncated file fails here, not mid-stage.
        self._retry(lambda: self._conn.execute("SELECT key FROM responses LIMIT 1").fetchall())

    def _check_key_format(self) -> None:
        """Refuse a cache whose keys were computed another way (every lookup would miss, and a
        stale entry could be served for a different request): the file's meta table records
        dedup.KEY_VERSION, the first element cache_key hashes."""
        row = self._retry(lambda: self._conn.execute(
            "SELECT value FROM meta WHERE name = 'key_format'").fetchone())
        if row is None:  # new file, or one written before the meta table existed (format 1)
            self._retry(lambda: self._conn.execute(
                "INSERT OR IGNORE INTO meta VALUES ('key_format', ?)", (KEY_VERSION,)))
        elif row[0] != KEY_VERSION:
            raise CacheError(
                f"{self.path}: response cache written with key format {row[0]!r}, this version "
                f"uses {KEY_VERSION!r}; move it aside (mv {self.path} {self.path}.{row[0].replace('/', '-')}) "
                f"or point paths.cache_dir elsewhere"
            )

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the connection."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._writer is not None:
                self._writer.join()
            with self._lock:
                self._conn.close()

    def flush(self) -> None:
        """Block until every row put so far is committed; re-raise a writer failure."""
        with self._cond:
            while self._unwritten and self._error is None:
                self._cond.wait()
            if self._error is not None:
                err, self._error = self._error, None
                raise RuntimeError(f"response cache {self.path}: write failed: {err}") from err

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing and drained
                rows, self._queue = self._queue, []
            try:
                self._retry(functools.partial(self._commit_rows, rows))
            except BaseException as e:  # noqa: BLE001 - handed to the next flush()
                with self._cond:
                    self._error = e
            with self._cond:
                self._unwritten -= len(rows)
                self._cond.notify_all()

    def _commit_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """One transaction for a group of rows (called under self._lock via _retry)."""
        sql = f"INSERT OR REPLACE INTO responses VALUES ({', '.join('?' * len(rows[0]))})"
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.executemany(sql, rows)
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

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
                if "locked" not in msg and "busy" not in msg:
                    raise CacheError(damaged_message(self.path, e)) from e
                if time.monotonic() > deadline:
                    raise
                logger.debug("response cache %s busy (%s); retrying", self.path, e)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            except sqlite3.DatabaseError as e:  # "file is not a database", "malformed"
                raise CacheError(damaged_message(self.path, e)) from e

    def _fetchall(self, sql: str, params: Sequence[Any]) -> list[Any]:
        return self._conn.execute(sql, params).fetchall()

    def get_many(self, keys: Sequence[str]) -> dict[str, CachedReply]:
        self.flush()  # read our own writes
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
        """Queue one finished result for the writer thread (committed within milliseconds;
        `flush()` waits for it)."""
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
        with self._cond:
            if self._closing:
                raise RuntimeError(f"response cache {self.path} is closed")
            self._queue.append(row)
            self._unwritten += 1
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="llm-cache-writer", daemon=True
                )
                self._writer.start()
            self._cond.notify_all()

    def messages_for(self, messages_hash: str) -> list[dict[str, str]] | None:
        """The full messages behind a `messages_hash` of requests.parquet (None if unknown)."""
        self.flush()
        row = self._retry(
            lambda: self._conn.execute(
                "SELECT messages FROM responses WHERE messages_hash = ? LIMIT 1", (messages_hash,)
            ).fetchone()
        )
        return None if row is None else json.loads(row[0])

    def __len__(self) -> int:
        self.flush()
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

    def __init__(self, inner: LLMBackend, cache: ResponseCache, guard: Any = None) -> None:
        self.inner = inner
        self.cache = cache
        self.guard = guard  # llm/context_guard.py; None = no context check
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

        try:
            sent = send_distinct(
                self.inner, requests, keys, results, desc=desc, on_result=on_result,
                on_sent=store, guard=self.guard,
            )
        finally:
            self.cache.flush()  # every reply that arrived is on disk when generate ends
        self.hits += len(requests) - sent
        self.misses += sent
        return [r for r in results if r is not None]


def iter_rows(cache: ResponseCache, model: str | None = None) -> Iterable[dict[str, Any]]:
    """Every stored row (optionally of one model) as dicts; for notebooks and audits."""
    sql = "SELECT * FROM responses" + (" WHERE model = ?" if model else "")
    cache.flush()
    conn = cache._conn
    cur = cache._retry(lambda: conn.execute(sql, (model,) if model else ()))
    names = [d[0] for d in cur.description]
    for row in cache._retry(cur.fetchall):
        yield dict(zip(names, row, strict=True))
