"""Download benchmark files and verify their sha256.

    python jobs/data.py                                  # LoCoMo -> data/locomo10.json
    python jobs/data.py locomo longmemeval_s --data-dir /scratch/benchmarks
    python jobs/data.py --check all                      # verify what is there; download nothing
    python jobs/data.py smollm2-hf                       # SmolLM2 GGUF -> HF folder (llm=vllm_cpu)
    python jobs/data.py models <the job's overrides>     # every model that job loads -> HF cache
    python jobs/data.py models --check <overrides>       # are they all here? download nothing
    python jobs/data.py official                         # LightMem, mem0, LongMemEval checkouts
    python jobs/data.py official --from /shared/official # from local mirrors (no network)
    python jobs/data.py cache compact [--cache-dir DIR]  # merge cache segments, convert SQLite
    python jobs/data.py cache verify [--cache-dir DIR]   # re-read and check every cached record

LoCoMo (CC BY-NC 4.0, never vendored) is checked against the sha256 of the released file.
LongMemEval (Hugging Face dataset xiaowu0162/longmemeval-cleaned) publishes no checksums: the
first download records the sha256 it computed in a sidecar `<file>.sha256` (sha256sum format)
and every later run, and `--check`, verifies the file against it (trust on first use).
Downloads go to a temporary file in the data directory and are renamed into place only after
the checksum is verified, so a killed download never leaves a truncated benchmark file.

Exit codes: 0 ok; 1 `--check` found a missing, unverifiable or mismatched file; 2 a download
or verification failed (one line on stderr, no traceback).

`models` composes the job's config from the same overrides (Hydra's compose API; `-m` expands
a sweep, the experiment's own sweeper params included), lists every model that job loads
(structmem_gpu/node/model_refs.py, the list the job's preflight checks: answer LLM, judges and
panel members, encoder, window-packing tokenizer), prints their total size first (from the
hub's metadata when it answers, else the presets' `weights_gb`), then downloads each with
huggingface_hub's `snapshot_download` into the Hugging Face cache (HF_HOME / HF_HUB_CACHE;
resumable, with a progress bar; tokenizer files only for the window tokenizer). Run it on a
node with network (the login node); the compute node then runs with HF_HUB_OFFLINE=1.
Each cached or downloaded hub model is printed with the snapshot (commit) it resolves to: the
job records it in its manifest (`weights`) and in its response-cache keys when `revision` is
null; pin it with `llm.revision=<snapshot>`.
Exit codes: 0 every model present; 2 a model is missing (`--check`, or a path that cannot be
downloaded) or a download failed. `models` also fetches the official checkouts the job names
(below) when they are missing.

`official` fetches the three reference repositories whose texts the replication experiments
read at run time (structmem_gpu/prompts/pinned.py: zjunlp/LightMem 8fc9a91, mem0ai/mem0
b3ede5b, xiaowu0162/LongMemEval 9e0b455) as bare git repositories into paths.official_dir
(STRUCTMEM_OFFICIAL_DIR, else <data dir>/official), verifies that each holds its pinned commit
and prints where. `--from DIR` fetches from local repositories DIR/lightmem.git, ... instead of
the code host. Exit codes: 0 all present; 1 `--check` found one missing; 2 a fetch failed.

`cache` maintains paths.cache_dir (default .cache/structmem_gpu; its llm/ and embeddings/
segment stores, structmem_gpu/core/segstore.py). `compact` first converts a cache of the SQLite era
(llm/llm_responses.sqlite, embeddings/embeddings.sqlite; run it where SQLite's locks work, the
host that wrote them) into segments and renames the file *.converted, then merges every
published segment into one with one record per key; jobs may keep running meanwhile (a reader
whose segments were merged re-lists once). `verify` re-reads every record and checks its
checksum. Exit codes: 0 ok; 1 `verify` found a damaged segment; 2 a conversion failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/data.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.data.locomo import LOCOMO_SHA256  # noqa: E402
from structmem_gpu.core.errors import InputError, StructMemError  # noqa: E402
from structmem_gpu.core.hashing import file_sha256  # noqa: E402

log = logging.getLogger("structmem_gpu.data_job")

_HF = "https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned/resolve/main/"


@dataclass(frozen=True)
class Dataset:
    filename: str
    url: str
    sha256: str | None  # None: unpublished, recorded in a sidecar on first download


DATASETS: dict[str, Dataset] = {
    "locomo": Dataset(
        "locomo10.json",
        "https://raw.githubusercontent.com/snap-research/LoCoMo/main/data/locomo10.json",
        LOCOMO_SHA256,
    ),
    # ~280 MB: the usual LongMemEval setting (about 115k tokens of history per question).
    "longmemeval_s": Dataset(
        "longmemeval_s_cleaned.json", _HF + "longmemeval_s_cleaned.json", None
    ),
    # ~2.7 GB: about 500 sessions per question.
    "longmemeval_m": Dataset(
        "longmemeval_m_cleaned.json", _HF + "longmemeval_m_cleaned.json", None
    ),
    # ~15 MB: evidence sessions only.
    "longmemeval_oracle": Dataset("longmemeval_oracle.json", _HF + "longmemeval_oracle.json", None),
}

Fetcher = Callable[[str, Path], None]


def http_fetch(url: str, dest: Path) -> None:
    """Stream `url` into `dest` (which the caller later renames or deletes)."""
    import httpx  # lazy: `--check` and the tests never touch the network

    try:
        with httpx.stream("GET", url, follow_redirects=True, timeout=60.0) as resp:
            resp.raise_for_status()
            with open(dest, "wb") as f:
                for chunk in resp.iter_bytes(1 << 20):
                    f.write(chunk)
    except httpx.HTTPError as exc:
        raise StructMemError(f"download of {url} failed: {exc}") from exc


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def expected_sha256(ds: Dataset, data_dir: Path) -> str | None:
    """The published checksum, else the one recorded in the sidecar, else None."""
    if ds.sha256 is not None:
        return ds.sha256
    side = sidecar(data_dir / ds.filename)
    if not side.is_file():
        return None
    fields = side.read_text(encoding="utf-8").split()
    if not fields or len(fields[0]) != 64:
        raise InputError(side, "malformed checksum sidecar (expected '<sha256>  <file>')")
    return fields[0].lower()


def _write_sidecar(path: Path, digest: str) -> None:
    side = sidecar(path)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.part")
    tmp.write_text(f"{digest}  {path.name}\n", encoding="utf-8")
    os.replace(tmp, side)


def ensure(ds: Dataset, data_dir: Path, fetch: Fetcher = http_fetch, force: bool = False) -> Path:
    """Make `data_dir/ds.filename` present and verified; download only when needed."""
    data_dir.mkdir(parents=True, exist_ok=True)
    target = data_dir / ds.filename
    expected = expected_sha256(ds, data_dir)
    if target.is_file() and not force:
        actual = file_sha256(target)
        if expected is None:
            _write_sidecar(target, actual)  # present but never recorded: trust on first use
            log.info("%s: present; recorded sha256 %s in %s", target, actual, sidecar(target).name)
            return target
        if actual != expected:
            raise InputError(
                target, f"sha256 {actual} != expected {expected}; delete it or use --force"
            )
        log.info("%s: present, sha256 ok", target)
        return target

    # Same directory as the target so the final rename is atomic (same filesystem).
    tmp = data_dir / f".{ds.filename}.{os.getpid()}.part"
    try:
        log.info("downloading %s -> %s", ds.url, target)
        fetch(ds.url, tmp)
        actual = file_sha256(tmp)
        if ds.sha256 is not None and actual != ds.sha256:
            raise InputError(
                ds.url, f"downloaded sha256 {actual} != published {ds.sha256}; nothing written"
            )
        if ds.sha256 is None and expected is not None and actual != expected and not force:
            raise InputError(
                ds.url, f"downloaded sha256 {actual} != recorded {expected}; nothing written"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)  # after a successful rename this is a no-op
    if ds.sha256 is None:
        _write_sidecar(target, actual)
        log.info("%s: recorded sha256 %s in %s", target, actual, sidecar(target).name)
    else:
        log.info("%s: downloaded, sha256 ok", target)
    return target


def check(ds: Dataset, data_dir: Path) -> bool:
    """True when the file is present and matches its published or recorded checksum."""
    target = data_dir / ds.filename
    if not target.is_file():
        log.error("%s: missing", target)
        return False
    expected = expected_sha256(ds, data_dir)
    if expected is None:
        log.error("%s: no recorded checksum (run without --check once to record it)", target)
        return False
    actual = file_sha256(target)
    if actual != expected:
        log.error("%s: sha256 %s != expected %s", target, actual, expected)
        return False
    log.info("%s: sha256 ok", target)
    return True


# Not downloads: models made locally (llm=vllm_cpu serves an HF folder converted from the
# packaged GGUF into <cache dir>/models/, structmem_gpu/llm/convert.py).
MODELS = ("smollm2-hf",)


def default_cache_dir() -> Path:
    """paths.cache_dir's default (conf/paths/default.yaml) seen from the repository root."""
    return Path(os.environ.get("STRUCTMEM_CACHE_DIR") or ROOT / ".cache" / "structmem_gpu")


def default_model_python() -> str:
    """The vLLM environment's interpreter (it has transformers + gguf + accelerate)."""
    env = os.environ.get("STRUCTMEM_VLLM_PYTHON")
    local = ROOT / ".venv-vllm" / "bin" / "python"
    return env or (str(local) if local.exists() else sys.executable)


def ensure_model(name: str, cache_dir: Path, python: str, check_only: bool = False) -> bool:
    from structmem_gpu.llm.convert import SMOLLM2_HF_NAME, ensure_hf_model, is_converted

    target = cache_dir / "models" / SMOLLM2_HF_NAME
    if check_only:
        ok = is_converted(target)
        (log.info if ok else log.error)("%s: %s", target, "converted" if ok else "missing")
        return ok
    ensure_hf_model(target, "packaged", python=python)
    log.info("%s: ready", target)
    return True


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="LongMemEval has no published checksums: the first download records the sha256 "
        "it computed in <file>.sha256 and later runs and --check verify against it.",
    )
    parser.add_argument(
        "datasets",
        nargs="*",
        default=["locomo"],
        metavar="DATASET",
        help=f"any of {', '.join(DATASETS)} or 'all' (default: locomo); or the model "
        f"{', '.join(MODELS)}. `models <overrides>` instead fetches every model a job's "
        "config names (`python jobs/data.py models --help`)",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="default: data/")
    parser.add_argument("--check", action="store_true", help="only verify; download nothing")
    parser.add_argument(
        "--force",
        action="store_true",
        help="download again even if present (re-records the sidecar of unpublished checksums)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="models: paths.cache_dir (default .cache/structmem_gpu)",
    )
    parser.add_argument(
        "--python", default=None, help="models: interpreter that converts (default .venv-vllm's)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    names = list(DATASETS) if "all" in args.datasets else list(dict.fromkeys(args.datasets))
    unknown = [n for n in names if n not in DATASETS and n not in MODELS]
    if unknown:
        parser.error(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)} or all")
    args.datasets = names
    return args


def main(argv: Sequence[str] | None = None, fetch: Fetcher = http_fetch) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "models":  # a subcommand, never a dataset name
        return models_main(argv[1:])
    if argv and argv[0] == "official":
        return official_main(argv[1:])
    if argv and argv[0] == "cache":
        return cache_main(argv[1:])
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    cache_dir = args.cache_dir or default_cache_dir()
    python = args.python or default_model_python()
    if args.check:
        ok = [
            ensure_model(n, cache_dir, python, check_only=True)
            if n in MODELS
            else check(DATASETS[n], args.data_dir)
            for n in args.datasets
        ]
        return 0 if all(ok) else 1
    try:
        for name in args.datasets:
            if name in MODELS:
                ensure_model(name, cache_dir, python)
                continue
            ensure(DATASETS[name], args.data_dir, fetch=fetch, force=args.force)
    except (StructMemError, OSError) as err:  # OSError: disk full, permissions, …
        log.error("%s", err)
        return 2
    return 0


# ---- `official`: the pinned reference checkouts -------------------------------------------


def official_main(argv: Sequence[str]) -> int:
    from structmem_gpu.prompts import pinned

    parser = argparse.ArgumentParser(
        prog="python jobs/data.py official",
        description="Fetch the official reference repositories (bare, pinned commits) into "
        "paths.official_dir.")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="default: data/")
    parser.add_argument("--official-dir", type=Path, default=None,
                        help="default: $STRUCTMEM_OFFICIAL_DIR, else <data dir>/official")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="a folder of local repositories lightmem.git, mem0.git, "
                        "longmemeval.git to fetch from instead of the code host")
    parser.add_argument("--check", action="store_true", help="only verify; fetch nothing")
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    where = args.official_dir or pinned.official_dir_default(args.data_dir)
    return fetch_official(where, args.source, check_only=args.check)


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


def job_official(cfg: Any) -> dict[str, Path]:
    """The pinned checkouts a job's config names (prompts.sources.* at a pinned repository of
    paths.official_dir), by source name."""
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.prompts import pinned
    from structmem_gpu.prompts.official import SOURCE_NAMES, source_spec

    job = JobConfig.from_cfg(cfg)  # the entry point's config, read typed from here on
    folder = str(job.root.paths.official_dir) if job.root.paths is not None else "None"
    out = {}
    for name in SOURCE_NAMES:
        spec = source_spec(job, name)
        if spec is not None and spec == pinned.source(name, folder):
            out[name] = Path(folder)
    return out


# ---- `models`: every model a job's config names, fetched ahead -----------------------------


def parse_models_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python jobs/data.py models",
        description="Download every model the job with these overrides loads (answer LLM, "
        "judges, encoder, window tokenizer) into the Hugging Face cache, total size first.",
    )
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="the job's Hydra overrides, e.g. experiment=structmem_locomo")
    parser.add_argument("--check", action="store_true",
                        help="only verify the models are present (exit 2 listing those missing)")
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="the overrides are a sweep: fetch the models of every point")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(list(argv))


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


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of every point of `jobs/run.py -m <overrides>`: the experiment's
    `hydra.sweeper.params` first, then the command line's (Hydra's basic sweeper order)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3",
                               job_name="data_models"):
        base = compose("config", overrides=[o for o in fixed if not o.startswith("hydra.")],
                       return_hydra_config=True)
    from omegaconf import OmegaConf

    params = OmegaConf.select(base, "hydra.sweeper.params", default=None) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(lines), None)
    return [point for batch in batches for point in batch]


def job_models(overrides: Sequence[str]) -> list[Any]:
    """The job's models (structmem_gpu.node.model_refs.named_models, as its preflight lists them)."""
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.node.model_refs import named_models
    from structmem_gpu.run.pipeline import job_stage_names

    from structmem_gpu.config.job import JobConfig

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


def models_main(argv: Sequence[str]) -> int:
    args = parse_models_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(message)s")
    from hydra.errors import HydraException

    from structmem_gpu.node.model_refs import hub_cache_dir, locate

    try:
        points = sweep_points(args.overrides) if args.multirun else [list(args.overrides)]
        refs: dict[tuple[str, str | None], Any] = {}
        official: dict[str, Path] = {}
        for point in points:
            for ref in job_models(point):
                refs.setdefault((ref.name, ref.revision), ref)
            official.update(job_official(compose_job(point)))
    except (HydraException, StructMemError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # The official texts the job reads (conf/texts/official.yaml), like its models.
    for where in sorted(set(official.values())):
        names = [n for n, w in official.items() if w == where]
        rc = fetch_official(where, check_only=args.check, names=names)
        if rc:
            return 2
    rows = []  # (ref, location, GB to download or None)
    for ref in refs.values():
        where = locate(ref)
        fetchable = not where.present and where.status == "missing"
        size = download_gb(ref) if fetchable and not args.check else None
        if fetchable and size is None:
            size = ref.weights_gb
        rows.append((ref, where, size))
    _print_models(rows, hub_cache_dir())
    if args.check:
        missing = [r for r, where, _ in rows if not where.present and not r.convert_from_gguf]
        if missing:
            print("error: missing: " + ", ".join(f"{r.name} ({r.key})" for r in missing)
                  + "; fix: python jobs/data.py models "
                  + " ".join((["-m"] if args.multirun else []) + list(args.overrides)),
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



# ---- `cache`: compact and verify the segment stores under paths.cache_dir -----------------


def cache_main(argv: Sequence[str]) -> int:
    import json

    from structmem_gpu.core import segstore
    from structmem_gpu.embed import cache as emb_cache
    from structmem_gpu.llm import cache as llm_cache
    from structmem_gpu.llm.dedup import KEY_VERSION

    parser = argparse.ArgumentParser(prog="python jobs/data.py cache",
                                     description="Merge (compact) or check (verify) the LLM "
                                     "response and embedding caches of paths.cache_dir.")
    parser.add_argument("action", choices=("compact", "verify"))
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="paths.cache_dir (default .cache/structmem_gpu)")
    args = parser.parse_args(list(argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    root = args.cache_dir or default_cache_dir()
    stores = ((root / "llm", llm_cache, llm_cache.KIND, KEY_VERSION),
              (root / "embeddings", emb_cache, emb_cache.KIND, emb_cache.FORMAT))
    bad = False
    for folder, mod, kind, fmt in stores:
        store = folder / mod.CACHE_FILE
        if args.action == "compact":
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


if __name__ == "__main__":
    sys.exit(main())
