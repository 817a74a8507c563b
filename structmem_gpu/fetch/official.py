"""The pinned official reference checkouts (`python jobs/data.py official`): fetched as bare
repositories into paths.official_dir and verified to hold their pinned commits."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import StructMemError


def fetch_official(where: Path, source: Path | None = None, *, check_only: bool = False,
                   names: Sequence[str] | None = None) -> int:
    """Fetch (or, check_only, verify) the pinned checkouts into `where`; one line each."""
    from structmem_gpu.prompts import pinned

    missing, failed = [], []
    for name in names or list(pinned.PINNED):
        pin = pinned.PINNED[name]
        dest = where / pin.folder
        if check_only:
            ok = pinned.holds(dest, pin.commit)
            print(f"{name}: {dest} {'holds' if ok else 'MISSING'} {pin.commit[:12]}")
            if not ok:
                missing.append(name)
            continue
        try:
            src = None if source is None else str(source / pin.folder)
            path, fetched = pinned.fetch(name, where, src)
        except StructMemError as err:
            failed.append(str(err))
            continue
        print(f"{name}: {path} @ {pin.commit[:12]} ({'fetched' if fetched else 'present'})")
    if missing:
        print(f"error: missing {', '.join(missing)}; fix: {pinned.FETCH_COMMAND}", file=sys.stderr)
        return 1
    if failed:
        print("error: " + " | ".join(failed), file=sys.stderr)
        return 2
    if not check_only:
        print(f"official checkouts in {where} (paths.official_dir; STRUCTMEM_OFFICIAL_DIR={where} "
              "points jobs elsewhere at them)")
    return 0


def job_official(job: JobConfig) -> dict[str, Path]:
    """The pinned checkouts a job's config names (prompts.sources.* at a pinned repository of
    paths.official_dir), by source name."""
    from structmem_gpu.prompts import pinned
    from structmem_gpu.prompts.official import SOURCE_NAMES, source_spec

    folder = str(job.root.paths.official_dir) if job.root.paths is not None else "None"
    out = {}
    for name in SOURCE_NAMES:
        spec = source_spec(job, name)
        if spec is not None and spec == pinned.source(name, folder):
            out[name] = Path(folder)
    return out
