"""Append-only segment store: a key-value cache many hosts share on NFS, Lustre or GPFS.

Nothing here relies on shared memory or on POSIX/flock locks (SQLite's WAL needs both and is
single-host by design). A store is one directory:

    <root>/seg/<writer>-<seq>.seg    published segments: immutable once visible
    <root>/tmp/<writer>-<seq>.part   a segment being written (never read; a killed writer
                                     leaves one, `compact` removes those older than an hour)

A writer (one per process; `<writer>` = host-pid-random, unique without coordination) collects
records in memory and publishes them as one new segment: written whole under tmp/, fsynced,
then renamed into seg/ — a rename within one file system is atomic on every POSIX and
network file system, so a reader sees a complete segment or none. A killed writer loses only
the records it had not published yet. Readers list seg/, read each new segment's index once
(a footer), and read a record with one pread when asked for it; a segment that vanished (a
`compact` replaced it) triggers one re-listing.

Segment file (all integers little-endian):

    b"SMSEG\\x001\\n" | records ... | index (JSON) | trailer
    trailer = u64 index offset | u32 index length | u32 crc32(index) | b"SMSEGEND"
    index   = {"kind": ..., "format": ..., "writer": ..., "created": ...,
               "entries": [[key, offset, length, crc32, tag], ...]}

`tag` is an optional secondary key (the LLM cache's messages_hash). `compact` merges every
published segment into one with one record per key (the oldest published wins) and deletes
the merged ones; `verify` re-reads every record and checks its crc. Both are
`python jobs/data.py cache {compact,verify}`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import StructMemError

log = logging.getLogger(__name__)

MAGIC = b"SMSEG\x001\n"
END = b"SMSEGEND"
_TRAILER = struct.Struct("<QII8s")
SEG_DIR, TMP_DIR, SUFFIX = "seg", "tmp", ".seg"
STALE_PART_S = 3600.0  # a .part older than this belongs to a dead writer (a publish takes seconds)


class SegmentError(StructMemError):
    """A published segment is damaged or was written in another key format."""


@dataclass(frozen=True, slots=True)
class Loc:
    seg: int  # index into SegmentStore._names
    offset: int
    length: int
    crc: int


def writer_id() -> str:
    host = socket.gethostname().split(".")[0].replace("-", "_") or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some network file systems refuse fsync on a directory; the rename stands
        pass
    finally:
        os.close(fd)


def write_segment(root: Path, name: str, records: Iterable[tuple[str, bytes, str | None]],
                  meta: dict[str, Any]) -> Path:
    """Publish `records` (key, payload, tag) as seg/<name>.seg: write tmp, fsync, rename.
    Records are streamed to the file (a compact of a large store never holds it in memory)."""
    (root / TMP_DIR).mkdir(parents=True, exist_ok=True)
    (root / SEG_DIR).mkdir(parents=True, exist_ok=True)
    tmp = root / TMP_DIR / f"{name}.part"
    entries: list[list[Any]] = []
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        off = len(MAGIC)
        for key, payload, tag in records:
            entries.append([key, off, len(payload), zlib.crc32(payload), tag])
            f.write(payload)
            off += len(payload)
        index = json.dumps({**meta, "created": time.time(), "entries": entries},
                           separators=(",", ":")).encode()
        f.write(index)
        f.write(_TRAILER.pack(off, len(index), zlib.crc32(index), END))
        f.flush()
        os.fsync(f.fileno())
    final = root / SEG_DIR / f"{name}{SUFFIX}"
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def read_index(path: Path) -> dict[str, Any]:
    """The footer index of one segment; SegmentError when the file is not a whole segment."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if head != MAGIC or size < len(MAGIC) + _TRAILER.size:
                raise SegmentError(f"{path}: not a cache segment (bad header or truncated)")
            f.seek(size - _TRAILER.size)
            off, length, crc, end = _TRAILER.unpack(f.read(_TRAILER.size))
            if end != END or off + length + _TRAILER.size != size:
                raise SegmentError(f"{path}: truncated cache segment (bad trailer)")
            f.seek(off)
            raw = f.read(length)
    except OSError as e:
        raise SegmentError(f"{path}: unreadable cache segment ({e})") from e
    if zlib.crc32(raw) != crc:
        raise SegmentError(f"{path}: damaged cache segment (index checksum)")
    index = json.loads(raw)
    index["_data_end"] = off
    return index


class SegmentStore:
    """Readers' view of one store directory plus this process's writer (`publish`)."""

    def __init__(self, root: Path, *, kind: str, fmt: str, check: Any = None) -> None:
        self.root = root
        self.kind, self.fmt = kind, fmt
        self._check = check  # (path, index) -> None; raises on an unacceptable segment
        self._writer = writer_id()
        self._seq = 0
        self._names: list[str] = []
        self._seen: set[str] = set()
        self._index: dict[str, Loc] = {}
        self._tags: dict[str, str] | None = None  # tag -> key, built on first use
        (root / SEG_DIR).mkdir(parents=True, exist_ok=True)
        self.refresh()

    # --- reading --------------------------------------------------------------------------

    def segment_paths(self) -> list[Path]:
        return sorted((self.root / SEG_DIR).glob(f"*{SUFFIX}"))

    def refresh(self) -> int:
        """Index the segments published since the last call; returns how many were new."""
        new = 0
        for path in self.segment_paths():
            if path.name in self._seen:
                continue
            try:
                index = read_index(path)
            except SegmentError:
                if not path.exists():  # replaced by a compact between listing and opening
                    continue
                raise
            self._add(path.name, index)
            new += 1
        return new

    def _add(self, name: str, index: dict[str, Any]) -> None:
        if index.get("kind") != self.kind:
            raise SegmentError(f"{self.root / SEG_DIR / name}: a {index.get('kind')!r} segment in a "
                               f"{self.kind!r} store")
        if self._check is not None:
            self._check(self.root / SEG_DIR / name, index)
        self._seen.add(name)
        seg = len(self._names)
        self._names.append(name)
        for key, off, length, crc, tag in index["entries"]:
            if key not in self._index:  # first published wins; later copies are equal replies
                self._index[key] = Loc(seg, off, length, crc)
                if self._tags is not None and tag is not None:
                    self._tags.setdefault(tag, key)

    def _reload(self) -> None:
        self._names, self._seen, self._index, self._tags = [], set(), {}, None
        self.refresh()

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> Iterable[str]:
        return self._index.keys()

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Payloads of the known keys among `keys` (after picking up newly published segments)."""
        wanted = list(dict.fromkeys(keys))
        self.refresh()
        for attempt in (0, 1):
            try:
                return self._read([k for k in wanted if k in self._index])
            except FileNotFoundError:
                if attempt:
                    raise
                self._reload()  # a compact replaced segments we had indexed
        raise AssertionError("unreachable")

    def _read(self, keys: list[str]) -> dict[str, bytes]:
        by_seg: dict[int, list[str]] = {}
        for k in keys:
            by_seg.setdefault(self._index[k].seg, []).append(k)
        out: dict[str, bytes] = {}
        for seg, ks in by_seg.items():
            path = self.root / SEG_DIR / self._names[seg]
            fd = os.open(path, os.O_RDONLY)
            try:
                for k in ks:
                    loc = self._index[k]
                    data = os.pread(fd, loc.length, loc.offset)
                    if len(data) != loc.length or zlib.crc32(data) != loc.crc:
                        raise SegmentError(f"{path}: damaged record for key {k} (checksum)")
                    out[k] = data
            finally:
                os.close(fd)
        return out

    def key_for_tag(self, tag: str) -> str | None:
        self.refresh()
        if self._tags is None:
            self._tags = {}
            for path in self.segment_paths():
                if path.name not in self._seen:
                    continue
                for key, _o, _l, _c, t in read_index(path)["entries"]:
                    if t is not None:
                        self._tags.setdefault(t, key)
        return self._tags.get(tag)

    # --- writing --------------------------------------------------------------------------

    def publish(self, records: Sequence[tuple[str, bytes, str | None]]) -> Path | None:
        """Write `records` as a new segment of this writer and index it here at once."""
        if not records:
            return None
        self._seq += 1
        name = f"{self._writer}-{self._seq:06d}"
        path = write_segment(self.root, name, records, {"kind": self.kind, "format": self.fmt,
                                                       "writer": self._writer})
        self.refresh()
        return path


# --- maintenance: jobs/data.py cache {compact,verify} ---------------------------------------


def retire_legacy(legacy: Path) -> None:
    """After a SQLite-era cache file was copied into a segment: rename it *.converted (kept,
    never read again) and drop its WAL side files."""
    legacy.rename(legacy.with_name(legacy.name + ".converted"))
    for side in ("-wal", "-shm"):
        Path(f"{legacy}{side}").unlink(missing_ok=True)


def iter_records(path: Path) -> Iterator[tuple[str, bytes, str | None]]:
    """Every record of one segment, crc-checked."""
    index = read_index(path)
    with open(path, "rb") as f:
        for key, off, length, crc, tag in index["entries"]:
            f.seek(off)
            data = f.read(length)
            if len(data) != length or zlib.crc32(data) != crc:
                raise SegmentError(f"{path}: damaged record for key {key} (checksum)")
            yield key, data, tag


def verify(root: Path) -> dict[str, Any]:
    """Re-read every record of every published segment; counts and the damaged files."""
    segs = sorted((root / SEG_DIR).glob(f"*{SUFFIX}"))
    keys: set[str] = set()
    records, damaged = 0, []
    for path in segs:
        try:
            for key, _data, _tag in iter_records(path):
                records += 1
                keys.add(key)
        except SegmentError as e:
            damaged.append(str(e))
    parts = sorted((root / TMP_DIR).glob("*.part")) if (root / TMP_DIR).is_dir() else []
    return {"store": str(root), "segments": len(segs), "records": records, "keys": len(keys),
            "duplicates": records - len(keys), "damaged": damaged, "unpublished_parts": len(parts)}


def compact(root: Path, *, kind: str, fmt: str) -> dict[str, Any]:
    """Merge every published segment into one with one record per key (the oldest published
    wins); remove the merged segments and stale .part files. Damaged segments and segments of
    another format are left in place and named. Streams: memory holds the indexes only."""
    segs = sorted((root / SEG_DIR).glob(f"*{SUFFIX}"))
    indexes: list[tuple[Path, dict[str, Any]]] = []
    damaged: list[str] = []
    for path in segs:
        try:
            index = read_index(path)
        except SegmentError as e:
            if path.exists():
                damaged.append(str(e))
            continue
        if index.get("kind") != kind or index.get("format") != fmt:
            damaged.append(f"{path}: kind/format {index.get('kind')}/{index.get('format')}, "
                           f"expected {kind}/{fmt}")
            continue
        indexes.append((path, index))
    indexes.sort(key=lambda pi: (float(pi[1].get("created", 0.0)), pi[0].name))
    winner: dict[str, int] = {}
    total = 0
    for n, (_path, index) in enumerate(indexes):
        total += len(index["entries"])
        for entry in index["entries"]:
            winner.setdefault(entry[0], n)

    def records() -> Iterator[tuple[str, bytes, str | None]]:
        for n, (path, _index) in enumerate(indexes):
            for key, data, tag in iter_records(path):
                if winner.get(key) == n:
                    winner[key] = -1  # written; a second copy inside one segment is skipped
                    yield key, data, tag

    out = None
    if len(indexes) > 1 or total != len(winner):
        out = write_segment(root, f"compact-{writer_id()}-{int(time.time())}", records(),
                            {"kind": kind, "format": fmt, "writer": "compact"})
        for path, _index in indexes:
            path.unlink(missing_ok=True)
    removed_parts = 0
    now = time.time()
    for part in (root / TMP_DIR).glob("*.part") if (root / TMP_DIR).is_dir() else []:
        try:
            if now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
                removed_parts += 1
        except FileNotFoundError:
            pass
    return {"store": str(root), "merged_segments": len(indexes) if out else 0,
            "keys": len(winner), "records_before": total, "output": str(out) if out else None,
            "damaged": damaged, "stale_parts_removed": removed_parts}
