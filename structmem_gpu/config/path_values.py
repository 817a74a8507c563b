"""Path values written the way a shell would expand them, whatever reached the job.

    expand_paths(cfg)   # 'prompts.sources.mem0': '~/src/mem0.git@b3ede5b' -> '/home/me/src/...'

A shell expands `~` and `$HOME` in an unquoted word before Hydra sees it, but not in a quoted
override (`'benchmark.path="~/data/locomo10.json"'`; Hydra cannot parse an unquoted `~`), in a
YAML file or in an environment variable read by `${oc.env:...}`. So that every path knob
(benchmark.path, paths.*, prompts.sources.*, a local llm.model or embedder.model, ...) takes
`~/x`, `$HOME/x` and relative paths alike, jobs/run.py and `jobs/data.py models` rewrite, before
anything reads the config, every string value that begins with `~` or `$NAME` (alone or followed
by `/`) as os.path.expanduser / expandvars would. Relative paths need nothing: jobs run in the
directory they were launched from (hydra.job.chdir: false). A prompt text or id never begins
that way (`$` followed by a name, then `/` or nothing), so no other value changes.
"""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import DictConfig, ListConfig

_SHELL_PATH = re.compile(r"(~[A-Za-z0-9_.-]*|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)(/.*)?", re.DOTALL)


def expand_value(value: str) -> str:
    """`value` expanded as a shell word (unchanged unless it begins with ~ or $NAME)."""
    if not _SHELL_PATH.fullmatch(value):
        return value
    return os.path.expandvars(os.path.expanduser(value))


def expand_paths(cfg: DictConfig, skip: tuple[str, ...] = ("hydra",)) -> list[str]:
    """Rewrite in place the string values of `cfg` (top-level nodes in `skip` left out) that
    begin like a shell path; the dotted keys changed."""
    changed: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
        for key in keys:
            path = f"{prefix}[{key}]" if isinstance(node, ListConfig) else (
                f"{prefix}.{key}" if prefix else str(key))
            if not prefix and str(key) in skip:
                continue
            value = node[key]
            if isinstance(value, (DictConfig, ListConfig)):
                walk(value, path)
            elif isinstance(value, str):
                new = expand_value(value)
                if new != value:
                    node[key] = new
                    changed.append(path)

    walk(cfg, "")
    return changed
