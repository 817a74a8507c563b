"""Run directories keyed by the configuration: one configuration, one run directory.

conf/config.yaml names a job's directory with the `run_key` resolver over Hydra's task
overrides, keeping only those that can change a result (structmem_gpu/config/result_keys.py):

    python jobs/run.py debug=scripted                      -> runs/sample/structmem/debug=scripted
    python jobs/run.py debug=scripted consolidate.seed_k=5 -> .../consolidate.seed_k=5,debug=scripted
    python jobs/run.py                                     -> runs/sample/structmem  (no key)
    python jobs/run.py benchmark.path=data/locomo10.json   -> .../benchmark.path=locomo10.json-1f0c9a2e

The same command always gives the same directory (so it resumes); two configurations never
share one unless `hydra.run.dir` says so. In a single job, `method` and `benchmark` are already
in the path and the judge is left out on purpose: rows of several judges accumulate in one
run (docs/evaluation.md "Evaluation protocols"). A sweep point's subdirectory (`mode=sweep`) keeps method,
benchmark and judge, since points of one sweep must never meet on a directory's lock. Shard
keys stay in both, so shards never share a directory either.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable

from structmem_gpu.config.result_keys import changes_result, split_override

RESOLVER = "run_key"
MAX_CHARS = 120  # past this the key keeps a readable head and a hash of the whole
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]+")
_IN_PATH = ("method", "benchmark")  # `${benchmark.name}/${method.name}` of hydra.run.dir


def _short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def _kept(key: str, mode: str) -> bool:
    if not changes_result(key):
        return False
    head = key.lstrip("~").split(".", 1)[0]
    if mode == "run" and (head == "judge" or key in _IN_PATH):
        return False
    return True


def _value(key: str, value: str) -> str:
    if key == "benchmark.path" and value:
        # A path's slashes would nest directories; two files of one name must still differ.
        return f"{os.path.basename(value.rstrip('/')) or 'path'}-{_short_hash(os.path.abspath(value))}"
    return value


def run_key(overrides: Iterable[str], mode: str = "run") -> str:
    """The directory name part for these task overrides ("" when none changes a result)."""
    if mode not in ("run", "sweep"):
        raise ValueError(f"run_key mode must be 'run' or 'sweep', not {mode!r}")
    items = []
    for override in overrides:
        key, value = split_override(override)
        if _kept(key, mode):
            items.append(key if value is None else f"{key}={_value(key, value)}")
    text = _UNSAFE.sub("_", ",".join(sorted(items)))
    if len(text) > MAX_CHARS:
        text = f"{text[:MAX_CHARS - 12].rstrip(',_')}-{_short_hash(text, 10)}"
    return text


def _resolve(mode: str, overrides: Iterable[str]) -> str:
    key = run_key(overrides or (), mode)
    return f"/{key}" if key and mode == "run" else key


def register() -> None:
    """Make `${run_key:run|sweep,${hydra.overrides.task}}` available to Hydra's config."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)
