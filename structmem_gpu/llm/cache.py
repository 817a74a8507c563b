"""Response cache: a segment store keyed by model, sampling, prompt version, schema and messages.

    cache = ResponseCache(Path(".cache/structmem_gpu/llm"))   # -> llm/llm_responses.seg/
    llm = CachedBackend(HTTPBackend(...), cache)
    llm.generate(requests)   # first run: sends everything, publishes replies as they land
    llm.generate(requests)   # rerun: zero server calls, cache_hit=True, attempts=0

The key covers everything that changes a reply: the backend's `model_id` (served name + weights
path/id + revision: two models never share an entry), backend request extras, the sampling
parameters, the prompt version, the JSON schema and the exact messages. Only parse_ok results
are stored, so failures are re-sent next time.

Storage (structmem_gpu/core/segstore.py): every process appends to segments of its own and
publishes them atomically by rename — every `publish_every` replies or `publish_s` seconds,
whichever comes first, and whenever `CachedBackend.generate` returns or raises. Readers open
published segments read-only and pick up other jobs' segments at each lookup. Nothing relies
on SQLite, shared memory or POSIX/flock locks, so jobs on many hosts may share one
`paths.cache_dir` on NFS, Lustre or GPFS: a killed job loses at most its last unpublished
interval, never damages the cache. `python jobs/data.py cache compact` merges the segments
(one reply per key) and converts a cache of the SQLite era (llm_responses.sqlite) once;
`... cache verify` re-reads and checks every record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.core import segstore

# cache_key lives with the in-batch dedup (same key); importers of cache.cache_key still work
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.llm.dedup import KEY_VERSION, Item, cache_key, send_distinct
from structmem_gpu.llm.structured import OnResult, check_reply
from structmem_gpu.llm.types import (LLMBackend, LLMRequest, LLMResult, Requests, noted,
                                     sampling_json, schema_json)

logger = logging.getLogger(__name__)

CACHE_FILE = "llm_responses.seg"  # the store directory under the cache dir
LEGACY_FILE = "llm_responses.sqlite"  # the SQLite (WAL) cache before segments; see compact
KIND = "llm-response"
COLUMNS = (  # one stored row, as iter_rows yields it (the SQLite table's columns, same order)
    "key", "model", "prompt_version", "messages_hash", "messages", "schema", "sampling", "text",
    "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "parse_ok",
    "attempts", "latency_s", "created_at",
)


class CacheError(StructMemError):
    """The response cache is damaged or was written by an incompatible version."""


def damaged_message(path: Path, err: Exception) -> str:
    return (f"{path}: response cache unreadable ({err}); move it aside and rerun "
            f"(mv {path} {path}.damaged) — finished stages are kept, only their LLM replies "
            f"are recomputed when needed — or set cache.llm=false to run without it")


def _check_format(path: Path, index: dict[str, Any]) -> None:
    """Refuse a segment whose keys were computed another way (every lookup would miss, and a
    stale entry could be served for a different request): each segment records
    dedup.KEY_VERSION, the first element cache_key hashes."""
    fmt = index.get("format")
    if fmt != KEY_VERSION:
        raise CacheError(
            f"{path}: response cache segment written with key format {fmt!r}, this version "
            f"uses {KEY_VERSION!r}; move it aside (mv {path} {path}.{str(fmt).replace('/', '-')}) "
            f"or point paths.cache_dir elsewhere"
        )


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
    """One segment store under `cache_dir`, shared by every model, run, process and host.

    publish_every / publish_s: how many replies, or seconds after the first unpublished one,
    a process collects before publishing a segment. Smaller loses less to a SIGKILL (a job
    killed mid-stage recomputes at most this interval) but writes more, smaller files (which
    `cache compact` merges); each publish is one file write + fsync + rename."""

    def __init__(self, cache_dir: Path, *, publish_every: int = 1000, publish_s: float = 2.0,
                 busy_timeout_s: float | None = None) -> None:
        del busy_timeout_s  # accepted for callers of the SQLite era; nothing waits on a lock now
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.path = cache_dir / CACHE_FILE
        self.publish_every = max(1, int(publish_every))
        self.publish_s = float(publish_s)
        legacy = cache_dir / LEGACY_FILE
        if legacy.exists():
            logger.warning("%s: a response cache of the SQLite era is not read; convert it once "
                           "with `python jobs/data.py cache compact --cache-dir %s`",
                           legacy, cache_dir.parent)
        self._lock = threading.Lock()  # the store's index: used from the client's loop thread too
        try:
            self._store = segstore.SegmentStore(self.path, kind=KIND, fmt=KEY_VERSION,
                                                check=_check_format)
        except segstore.SegmentError as e:
            raise CacheError(damaged_message(_named(e, self.path), e)) from e
        # Rows waiting to be published; the publisher thread (started on first put) publishes
        # them when publish_every are waiting or publish_s have passed; flush() publishes now.
        self._cond = threading.Condition()
        self._queue: list[dict[str, Any]] = []
        self._first_queued = 0.0
        self._publishing = 0  # rows being written by some thread
        self._writer: threading.Thread | None = None
        self._closing = False
        self._error: BaseException | None = None

    def close(self) -> None:
        """Publish what is queued, stop the publisher thread."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._writer is not None:
                self._writer.join()

    def flush(self) -> None:
        """Publish every row put so far (block until it is on disk); re-raise a write failure."""
        with self._cond:
            rows, self._queue = self._queue, []
            self._publishing += len(rows)
        if rows:
            self._publish(rows)
        with self._cond:
            while self._publishing and self._error is None:
                self._cond.wait()
            if self._error is not None:
                err, self._error = self._error, None
                raise RuntimeError(f"response cache {self.path}: write failed: {err}") from err

    def _publish(self, rows: list[dict[str, Any]]) -> None:
        try:
            records = [(r["key"], json.dumps(r, separators=(",", ":")).encode(),
                        r["messages_hash"]) for r in rows]
            with self._lock:
                self._store.publish(records)
        except BaseException as e:  # noqa: BLE001 - handed to the next flush()
            with self._cond:
                self._error = e
        finally:
            with self._cond:
                self._publishing -= len(rows)
                self._cond.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing:
                    if len(self._queue) >= self.publish_every:
                        break
                    if self._queue:
                        left = self._first_queued + self.publish_s - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    else:
                        self._cond.wait()
                if self._closing and not self._queue:
                    return
                rows, self._queue = self._queue, []
                self._publishing += len(rows)
            if rows:
                self._publish(rows)

    def get_many(self, keys: Sequence[str], *, publish: bool = True) -> dict[str, CachedReply]:
        """The stored replies of `keys`; `publish=False` skips publishing this process's
        queued replies first (a stream's later lookups: a key sent in this batch is answered
        by dedup, llm/dedup.py, and publishing is blocking disk work)."""
        if publish:
            self.flush()  # read our own writes
        try:
            with self._lock:
                raw = self._store.get_many(keys)
        except segstore.SegmentError as e:
            raise CacheError(damaged_message(_named(e, self.path), e)) from e
        found: dict[str, CachedReply] = {}
        for key, data in raw.items():
            r = json.loads(data)
            found[key] = CachedReply(r["text"], r["prompt_tokens"], r["completion_tokens"],
                                     r["cached_tokens"], r["finish_reason"], bool(r["parse_ok"]),
                                     r["attempts"], r["latency_s"])
        return found

    def put(self, key: str, req: LLMRequest, res: LLMResult) -> None:
        """Queue one finished result for publication (within publish_s seconds or
        publish_every replies; `flush()` publishes at once)."""
        row = dict(zip(COLUMNS, (
            key,
            res.model,
            req.prompt_version,
            res.messages_hash,
            req.messages_json,
            None if req.schema is None else schema_json(req.schema),
            sampling_json(req.sampling),
            res.text,
            res.prompt_tokens,
            res.completion_tokens,
            res.cached_tokens,
            res.finish_reason,
            int(res.parse_ok),
            res.attempts,
            res.latency_s,
            time.time(),
        ), strict=True))
        with self._cond:
            if self._closing:
                raise RuntimeError(f"response cache {self.path} is closed")
            if not self._queue:
                self._first_queued = time.monotonic()
            self._queue.append(row)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="llm-cache-writer", daemon=True
                )
                self._writer.start()
            if len(self._queue) == 1 or len(self._queue) >= self.publish_every:
                self._cond.notify_all()

    def messages_for(self, messages_hash: str) -> list[dict[str, str]] | None:
        """The full messages behind a `messages_hash` of requests.parquet (None if unknown)."""
        row = self.row_for(messages_hash)
        return None if row is None else json.loads(row["messages"])

    def row_for(self, messages_hash: str) -> dict[str, Any] | None:
        """One stored row (COLUMNS) behind a `messages_hash` (None if unknown): its model,
        sampling and schema too, which `jobs/report.py differential` lists beside the messages."""
        self.flush()
        with self._lock:
            key = self._store.key_for_tag(messages_hash)
            raw = self._store.get_many([key]) if key is not None else {}
        return None if key is None else json.loads(raw[key])

    def __len__(self) -> int:
        self.flush()
        with self._lock:
            self._store.refresh()
            return len(self._store)


def _named(err: Exception, default: Path) -> Path:
    """The segment file a SegmentError names (its message starts with the path)."""
    head = str(err).split(":", 1)[0]
    return Path(head) if head.endswith(segstore.SUFFIX) else default


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

    streams = True  # takes an iterator (llm/types.py); passes it on to a streaming inner
    LOOKUP_CHUNK = 256  # a stream's requests are looked up this many at a time

    def generate(
        self, requests: Requests, *, desc: str = "", on_result: OnResult | None = None,
        total: int | None = None,
    ) -> list[LLMResult]:
        stream = not isinstance(requests, Sequence)
        # a stream is looked up a chunk at a time as the inner backend draws it; a list at once
        chunks = _chunks(requests, self.LOOKUP_CHUNK) if stream else [requests]
        drawn: list[Item] = []  # (request, key, hit) by index, for the write-through

        def store(i: int, res: LLMResult) -> None:  # write-through: a crash loses no reply
            if res.parse_ok:
                self.cache.put(drawn[i][1], drawn[i][0], res)

        try:
            results, sent = send_distinct(
                self.inner, noted(self._lookup(chunks, log_as=None if stream else desc), drawn),
                desc=desc, on_result=on_result, on_sent=store,
                guard=self.guard, stream=stream, total=total,
            )
        finally:
            self.cache.flush()  # every reply that arrived is on disk when generate ends
        self.hits += len(results) - sent
        self.misses += sent
        return results

    def _lookup(self, chunks: Iterable[Sequence[LLMRequest]],
                log_as: str | None = None) -> Iterator[Item]:
        """(request, key, hit or None) for each request, one get_many per chunk (only the first
        publishes this process's queued replies); `log_as` logs each chunk's hit count."""
        params = getattr(self.inner, "cache_params", {})
        for n, chunk in enumerate(chunks):
            keys = [cache_key(self.model_id, r, params) for r in chunk]
            found = self.cache.get_many(keys, publish=n == 0)
            if log_as is not None:
                logger.info("%s: %d cached, %d to send (of %d)", log_as or "llm",
                            sum(k in found for k in keys),
                            len({k for k in keys if k not in found}), len(keys))
            for r, k in zip(chunk, keys, strict=True):
                yield r, k, (_hit_result(r, found[k], self.model_id) if k in found else None)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for x in items:
        chunk.append(x)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def iter_rows(cache: ResponseCache, model: str | None = None) -> Iterable[dict[str, Any]]:
    """Every stored row (optionally of one model) as dicts; for notebooks and audits."""
    cache.flush()
    with cache._lock:
        cache._store.refresh()
        keys = list(cache._store.keys())
    for start in range(0, len(keys), 1000):
        with cache._lock:
            raw = cache._store.get_many(keys[start : start + 1000])
        for data in raw.values():
            row = json.loads(data)
            if model is None or row["model"] == model:
                yield row


def convert_legacy(cache_dir: Path) -> int:
    """Copy every row of a SQLite-era cache (cache_dir/llm_responses.sqlite) into one segment,
    then rename the file to *.converted; returns the rows copied. Run it where SQLite's locks
    work (the host that wrote the file, or any host once no job uses it)."""
    import sqlite3  # only the one-time conversion touches SQLite

    legacy = cache_dir / LEGACY_FILE
    conn = sqlite3.connect(legacy)
    try:
        try:
            fmt = conn.execute("SELECT value FROM meta WHERE name = 'key_format'").fetchone()
        except sqlite3.OperationalError:  # format 1 files had no meta table: same keys
            fmt = None
        if fmt is not None and fmt[0] != KEY_VERSION:
            raise CacheError(f"{legacy}: key format {fmt[0]!r}, this version uses "
                             f"{KEY_VERSION!r}; not converted (move it aside)")
        cur = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM responses")
        store = segstore.SegmentStore(cache_dir / CACHE_FILE, kind=KIND, fmt=KEY_VERSION,
                                      check=_check_format)
        n = 0
        while rows := cur.fetchmany(5000):
            records = []
            for row in rows:
                r = dict(zip(COLUMNS, row, strict=True))
                records.append((r["key"], json.dumps(r, separators=(",", ":")).encode(),
                                r["messages_hash"]))
            store.publish(records)
            n += len(records)
    finally:
        conn.close()
    segstore.retire_legacy(legacy)
    return n
