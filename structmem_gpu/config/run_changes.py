"""What a job changes in a run directory that held another configuration.

Run directories are keyed by the configuration (structmem_gpu/config/run_key.py), so this happens
only when a user points two configurations at one `hydra.run.dir` on purpose. The job then
says, before it recomputes anything and before `.hydra/` is rewritten, which keys changed and
which stages' tables it will replace:

    run directory outputs/x held another configuration: 1 key changed (consolidate.seed_k:
    15 -> 5); this job replaces the tables of stages consolidate, retrieve, answer, judge, report
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.config.result_keys import changes_result
from structmem_gpu.config.settings import leaf_items

log = logging.getLogger(__name__)
SHOWN = 8  # changed keys named in the log line; the rest are counted


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) of every leaf that differs and can change a result
    (a key present on one side only has None on the other)."""
    a, b = dict(leaf_items(old)), dict(leaf_items(new))
    out = []
    for key in sorted(set(a) | set(b)):
        if changes_result(key) and a.get(key) != b.get(key):
            out.append((key, a.get(key), b.get(key)))
    return out


def previous_config(run_dir: Path) -> dict[str, Any] | None:
    """The config the directory's last job saved (.hydra/config.yaml), unresolved, or None."""
    from omegaconf import OmegaConf

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return data if isinstance(data, dict) else None


def describe(run_dir: Path, changes: Sequence[tuple[str, Any, Any]], replaced: Sequence[str]) -> str:
    named = ", ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in changes[:SHOWN])
    more = f" and {len(changes) - SHOWN} more" if len(changes) > SHOWN else ""
    stages = ", ".join(replaced) if replaced else "none (all finished stages stay valid)"
    return (f"run directory {run_dir} held another configuration: {len(changes)} "
            f"key{'s' if len(changes) != 1 else ''} changed ({named}{more}); this job "
            f"replaces the tables of stages {stages}")


def log_changes(run_dir: Path, cfg: Any, replaced: Callable[[], Sequence[str]]) -> str | None:
    """Log (warning) what changed against the directory's previous config; the line or None.
    `replaced` predicts the stages that will recompute; it is called only when keys changed
    (it hashes input tables and files, which costs time on a large benchmark)."""
    from omegaconf import OmegaConf

    old = previous_config(run_dir)
    if old is None:
        return None
    new = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(new, dict)
    changes = changed_keys(old, new)
    if not changes:
        return None
    line = describe(run_dir, changes, replaced())
    log.warning("%s", line)
    return line
