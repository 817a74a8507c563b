"""Every model a job loads, listed and fetched ahead (`python jobs/data.py models <overrides>`):
composed from the job's own overrides (a sweep's points with -m), located in the HF cache,
sized from the hub's file list, downloaded with snapshot_download (resumable)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.sweep_points import sweep_points
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.fetch.datasets import ROOT
from structmem_gpu.fetch.official import fetch_official, job_official

log = logging.getLogger("structmem_gpu.data_job")


def compose_job(overrides: Sequence[str]) -> Any:
    """The job's config, composed by Hydra as `jobs/run.py <overrides>` would compose it."""
    from hydra import compose, initialize_config_dir

    from structmem_gpu.node.model_refs import NOT_FOR_MODELS

    from structmem_gpu.config.path_values import expand_paths

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3",
                               job_name="data_models"):
        cfg = compose("config",
                      overrides=[o for o in overrides if not o.startswith(NOT_FOR_MODELS)])
    expand_paths(cfg)  # as jobs/run.py does: `~/x`, `$HOME/x` in any path knob
    return cfg


def job_models(overrides: Sequence[str]) -> list[Any]:
    """The job's models (structmem_gpu.node.model_refs.named_models, as its preflight lists them)."""
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.node.model_refs import named_models
    from structmem_gpu.run.pipeline import job_stage_names

    job = JobConfig.from_cfg(compose_job(overrides))
    registry = stage_registry(job)
    stages = [registry[name] for name in job_stage_names(job) if name in registry]
    return named_models(job, stages)


def _folder_gb(path: Path) -> float:
    """Size of a model folder (or GGUF file) in GB; cache symlinks count their blobs."""
    files = path.rglob("*") if path.is_dir() else [path]
    return sum(p.stat().st_size for p in files if p.is_file()) / 1e9


def _allow(ref: Any) -> list[str] | None:
    from structmem_gpu.node.model_refs import TOKENIZER_FILES

    return list(TOKENIZER_FILES) if ref.tokenizer_only else None


def download_gb(ref: Any) -> float | None:
    """What a download of `ref` would fetch (GB) from the hub's file list (no file is
    fetched), else the size its preset states (`weights_gb`), else None."""
    from structmem_gpu.node.model_refs import hub_cache_dir, hub_offline

    if not hub_offline():
        from huggingface_hub import snapshot_download

        try:
            files = snapshot_download(ref.name, revision=ref.revision, cache_dir=hub_cache_dir(),
                                      allow_patterns=_allow(ref), dry_run=True, etag_timeout=5)
            return sum(f.file_size or 0 for f in files if f.will_download) / 1e9
        except Exception as exc:  # offline, gated, not found: the preset's size, then the error
            log.debug("%s: no size from the hub (%s)", ref.name, exc)
    return ref.weights_gb


def fetch_job_models(overrides: Sequence[str], *, multirun: bool = False, check: bool = False) -> int:
    """List every model (and official checkout) the job with `overrides` loads, then fetch the
    missing ones (check: only verify). 0 every model present; 2 one is missing or failed."""
    from hydra.errors import HydraException

    from structmem_gpu.node.model_refs import hub_cache_dir, locate

    try:
        points = sweep_points(overrides) if multirun else [list(overrides)]
        refs: dict[tuple[str, str | None], Any] = {}
        official: dict[str, Path] = {}
        for point in points:
            for ref in job_models(point):
                refs.setdefault((ref.name, ref.revision), ref)
            official.update(job_official(JobConfig.from_cfg(compose_job(point))))
    except (HydraException, StructMemError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # The official texts the job reads (conf/texts/official.yaml), like its models.
    for where in sorted(set(official.values())):
        names = [n for n, w in official.items() if w == where]
        rc = fetch_official(where, check_only=check, names=names)
        if rc:
            return 2
    rows = []  # (ref, location, GB to download or None)
    for ref in refs.values():
        where = locate(ref)
        fetchable = not where.present and where.status == "missing"
        size = download_gb(ref) if fetchable and not check else None
        if fetchable and size is None:
            size = ref.weights_gb
        rows.append((ref, where, size))
    _print_models(rows, hub_cache_dir())
    if check:
        missing = [r for r, where, _ in rows if not where.present and not r.convert_from_gguf]
        if missing:
            print("error: missing: " + ", ".join(f"{r.name} ({r.key})" for r in missing)
                  + "; fix: python jobs/data.py models "
                  + " ".join((["-m"] if multirun else []) + list(overrides)),
                  file=sys.stderr)
            return 2
        return 0
    return _fetch_models(rows)


def _pin_hint(ref: Any) -> str:
    """How to pin an LLM's weights to the snapshot shown (llm configs have `revision`)."""
    if ref.revision or not ref.key.endswith("llm.model"):
        return ""
    return f" (pin: {ref.key[:-len('model')]}revision=<snapshot>)"


def _print_models(rows: Sequence[tuple[Any, Any, float | None]], cache: Path) -> None:
    to_fetch = [size for _, where, size in rows if where.status == "missing"]
    known = [s for s in to_fetch if s is not None]
    total = f"{sum(known):.1f} GB" + (f" + {len(to_fetch) - len(known)} of unknown size"
                                       if len(known) < len(to_fetch) else "")
    print(f"{len(rows)} model(s); to download: {len(to_fetch)}, {total} (into {cache})")
    from structmem_gpu.node.model_refs import resolved_snapshot

    for ref, where, size in rows:
        if where.present:
            state = f"{where.status} {where.path} ({_folder_gb(where.path):.1f} GB)"
            snap = resolved_snapshot(ref.name, ref.revision)
            if snap:  # the weights a job loads, recorded in its manifest (`weights`)
                state += f" snapshot {snap}{_pin_hint(ref)}"
        elif where.status == "missing":
            state = "to download" + (f" ({size:.1f} GB)" if size is not None else "")
        elif ref.convert_from_gguf:
            state = f"made by the job from {ref.convert_from_gguf} GGUF on first use ({where.path})"
        else:
            state = f"{where.path}: {where.detail} (a path: nothing to download)"
        print(f"  {ref.role:<24} {ref.name}  [{ref.key}]  {state}")


def _fetch_models(rows: Sequence[tuple[Any, Any, float | None]]) -> int:
    from huggingface_hub import snapshot_download

    from structmem_gpu.node.model_refs import hub_cache_dir, locate, resolved_snapshot

    failed = []
    for ref, where, _ in rows:
        if where.present or ref.convert_from_gguf:
            continue
        if where.status != "missing":
            failed.append(f"{ref.name} ({ref.key}): {where.detail}")
            continue
        log.info("downloading %s%s", ref.name, " (tokenizer files)" if ref.tokenizer_only else "")
        try:  # resumable: an interrupted download continues from its .incomplete files
            snapshot_download(ref.name, revision=ref.revision, cache_dir=hub_cache_dir(),
                              allow_patterns=_allow(ref))
        except Exception as exc:  # network, gated repo, disk full: one line per model
            failed.append(f"{ref.name} ({ref.key}): {type(exc).__name__}: {exc}".splitlines()[0])
            continue
        if not locate(ref).present:
            failed.append(f"{ref.name} ({ref.key}): downloaded but {locate(ref).detail}")
            continue
        print(f"  {ref.role:<24} {ref.name}  [{ref.key}]  snapshot "
              f"{resolved_snapshot(ref.name, ref.revision)}{_pin_hint(ref)}")
    if failed:
        print("error: not fetched: " + "; ".join(failed), file=sys.stderr)
        return 2
    log.info("all models present in %s", hub_cache_dir())
    return 0
