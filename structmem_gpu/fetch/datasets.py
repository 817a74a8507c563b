"""Benchmark files downloaded and verified by sha256 (`python jobs/data.py [DATASET ...]`), and
the models made locally rather than downloaded (`smollm2-hf`: the vllm_cpu profile's folder).

LoCoMo is checked against the released file's sha256; LongMemEval publishes none, so the first
download records the digest in a sidecar `<file>.sha256` (trust on first use). A download goes
to a temporary file beside the target and is renamed into place only once verified.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from structmem_gpu.core.errors import InputError, StructMemError
from structmem_gpu.core.hashing import file_sha256
from structmem_gpu.data.locomo import LOCOMO_SHA256

# The repository root: conf/, the default cache and the vLLM environment are found from it
# (as config/yaml_defaults.CONF_DIR finds conf/).
ROOT = Path(__file__).resolve().parents[2]
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
