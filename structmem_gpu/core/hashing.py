"""Stable content hashes used for ids, cache keys and fingerprints."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def stable_hash(*parts: Any, length: int = 16) -> str:
    """Hex digest of the canonical JSON of `parts` (truncated to `length` hex chars)."""
    digest = hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).hexdigest()
    return digest[:length]


def hash_canonical_parts(parts: Sequence[str], length: int = 16) -> str:
    """= stable_hash(*values) for values whose canonical JSON texts are `parts` (the canonical
    JSON of a list is its items' texts joined by "," in brackets): callers that keep a part's
    text (a request's messages, a shared schema) hash without encoding it again."""
    text = "[" + ",".join(parts) + "]"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


class IdentityMemo:
    """Values derived from an object (its canonical JSON, a compiled validator), memoised by
    the object's identity: a batch shares a few schema objects, and deriving again per
    request cost more than the request's own work. An entry holds its object, so the id
    cannot be reused while it is cached; the memo is cleared at `maxsize` entries (objects
    built per request would otherwise pile up). Objects must not be mutated after use."""

    def __init__(self, maxsize: int = 512) -> None:
        self.maxsize = maxsize
        self._entries: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def get(self, obj: Any, derive: Callable[[], T], *extra: Any) -> T:
        """The value `derive()` gave for this very object (and `extra`), computing it once."""
        key = (id(obj), *extra)
        hit = self._entries.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = derive()
        if len(self._entries) >= self.maxsize:
            self._entries.clear()
        self._entries[key] = (obj, value)
        return value


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
