"""Compact and verify the segment stores under paths.cache_dir (`python jobs/data.py cache`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("structmem_gpu.data_job")


def maintain(root: Path, action: str) -> int:
    """`compact` (convert an SQLite-era cache, then merge segments) or `verify` every store
    under cache root `root`; prints one JSON line per store. 0 ok; 1 a damaged segment; 2 a
    conversion failed."""
    from structmem_gpu.core import segstore
    from structmem_gpu.embed import cache as emb_cache
    from structmem_gpu.llm import cache as llm_cache
    from structmem_gpu.llm.dedup import KEY_VERSION

    stores = ((root / "llm", llm_cache, llm_cache.KIND, KEY_VERSION),
              (root / "embeddings", emb_cache, emb_cache.KIND, emb_cache.FORMAT))
    bad = False
    for folder, mod, kind, fmt in stores:
        store = folder / mod.CACHE_FILE
        if action == "compact":
            if (folder / mod.LEGACY_FILE).exists():
                try:
                    n = mod.convert_legacy(folder)
                except Exception as err:  # noqa: BLE001 - CacheError, OSError, sqlite3 errors
                    log.error("%s: not converted (%s)", folder / mod.LEGACY_FILE, err)
                    return 2
                log.info("%s: converted %d records into segments", folder / mod.LEGACY_FILE, n)
            if (store / segstore.SEG_DIR).is_dir():
                out = segstore.compact(store, kind=kind, fmt=fmt)
                bad |= bool(out["damaged"])
                print(json.dumps(out))
        elif (store / segstore.SEG_DIR).is_dir():
            out = segstore.verify(store)
            bad |= bool(out["damaged"])
            print(json.dumps(out))
    return 1 if bad else 0
