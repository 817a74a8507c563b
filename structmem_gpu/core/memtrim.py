"""Give freed heap memory back to the system between stages.

A stage frees its frames, requests and replies when it returns, but glibc's malloc keeps the
freed pages of its arenas (and Python's small-object arenas that are only partly empty keep
theirs), so the next stage starts on top of the last one's high-water mark: a question
group's consolidation peaked 0.4-0.7 GB higher after extraction than it needs (run/groups.py,
docs/performance.md). `malloc_trim(0)` returns the free top and free whole pages of every
arena. A no-op where the C library has no malloc_trim (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_free_memory"]


@functools.lru_cache(maxsize=1)
def _trim() -> object | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def release_free_memory() -> bool:
    """Trim the C heap; True when malloc_trim ran. No gc.collect(): a full collection costs
    ~0.1-1 s in a big process (the unit tier's pytest process: 11 -> 19 min with one per
    stage), and a stage's tables and requests are freed by reference counting anyway."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)  # type: ignore[operator]
    return True
