"""The official reference repositories for tests that score with official code or texts.

STRUCTMEM_OFFICIAL_DIR names a folder of bare repositories (`.ci/run`: ../shared/official):
lightmem.git, mem0.git, longmemeval.git, read at the commits below. Unset: the test is skipped
with that reason; set but missing a repository or commit: the test fails (CI never skips).
Files are read with `git show COMMIT:PATH` at test time; nothing of them is stored here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from structmem_gpu.prompts.pinned import PINNED

ENV = "STRUCTMEM_OFFICIAL_DIR"
# The pinned commits are the ones the replication experiments read (prompts/pinned.py).
COMMITS = {name: pin.commit for name, pin in PINNED.items()}


def repo(name: str) -> Path:
    value = os.environ.get(ENV)
    if not value:
        pytest.skip(f"{ENV} not set: no official {name} repository to score with")
    path = Path(value) / PINNED[name].folder
    assert path.is_dir(), f"{ENV}={value}: {path} does not exist"
    return path


def spec(name: str) -> str:
    """`PATH@COMMIT`, the form prompts.sources.* take."""
    return f"{repo(name)}@{COMMITS[name]}"


def show(name: str, file: str) -> str:
    """The text of `file` at the pinned commit."""
    out = subprocess.run(
        ["git", "-c", "safe.directory=*", "--git-dir", str(repo(name)), "show",
         f"{COMMITS[name]}:{file}"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout


def load_module(name: str, source: str) -> types.ModuleType:
    """Execute an official file's source as module `name` (test only, never stored)."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # pydantic resolves a model's annotations through its module
    exec(compile(source, name, "exec"), mod.__dict__)  # noqa: S102 - the reference's code, test only
    return mod


@contextmanager
def stub_modules(stub: dict[str, types.ModuleType]) -> Iterator[None]:
    """Stand-ins for the (heavy) packages an official file imports, only while it loads; the
    previous entries of sys.modules come back afterwards."""
    saved = {n: sys.modules.get(n) for n in stub}
    sys.modules.update(stub)
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
