"""How much of a LongMemEval file repeats: occurrences, distinct session ids, distinct contents.

    python jobs/bench.py lme-count --lme-file data/longmemeval_m_cleaned.json
    python jobs/bench.py lme-load          # counts each synthetic file it loads, too

A haystack place is an *occurrence* (question, position, date). Three ways of calling two
occurrences the same session, from coarse to fine:

- `distinct_ids`: the same session id;
- `distinct_contents`: the same id and turns (what a store by content keeps once);
- `distinct_dated`: the same turns and date (what the loader's session_hash keeps once today:
  data/longmemeval.py).

On the fixed-date synthetic shape the last two coincide; with dates drawn per haystack, as
LongMemEval's recipe draws them, `distinct_dated` approaches the occurrences while
`distinct_contents` stays at the pool's size. The file is streamed (data/jsonstream.py); only
one 16-byte digest per distinct key is held.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["count_file", "render"]


def _digest(*parts: Any) -> bytes:
    return hashlib.blake2b(json.dumps(parts, separators=(",", ":")).encode("utf-8"),
                           digest_size=16).digest()


def count_file(path: str | Path) -> dict[str, Any]:
    """The counts of one LongMemEval-format file (module docstring)."""
    from structmem_gpu.data.jsonstream import iter_json_list

    t0 = time.perf_counter()
    ids: set[str] = set()
    contents: set[bytes] = set()
    dated: set[bytes] = set()
    questions = occurrences = 0
    for rec in iter_json_list(path):
        questions += 1
        sessions = rec.get("haystack_sessions") or []
        for sid, date, turns in zip(rec.get("haystack_session_ids") or [],
                                    rec.get("haystack_dates") or [], sessions):
            occurrences += 1
            ids.add(str(sid))
            body = _digest(turns)
            contents.add(_digest(str(sid), body.hex()))
            dated.add(_digest(body.hex(), date))
    return {"file": str(path), "questions": questions, "occurrences": occurrences,
            "distinct_ids": len(ids), "distinct_contents": len(contents),
            "distinct_dated": len(dated), "count_s": round(time.perf_counter() - t0, 1)}


def render(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| file | questions | occurrences | distinct ids | distinct contents (id + turns) "
             "| distinct (turns + date) |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['file']} | skipped: {r['skipped']} | | | | |")
            continue
        lines.append(f"| {Path(r['file']).name} | {r['questions']:,} | {r['occurrences']:,} | "
                     f"{r['distinct_ids']:,} | {r['distinct_contents']:,} | "
                     f"{r['distinct_dated']:,} |")
    return lines
