"""The local Hugging Face cache, from files only: where it is, and which snapshot (commit) a
hub repository's revision resolves to there.

    resolved_snapshot("Qwen/Qwen2.5-7B-Instruct", None)   # 'a09a35...' (refs/main) or None

Read by model_refs.py (the preflight, `jobs/data.py models`, the manifest's `weights`) and by
the LLM factory, whose response-cache key holds the snapshot when `revision` is null. Nothing
here touches the network.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def hub_cache_dir() -> Path:
    """The HF hub cache as huggingface_hub resolves it from the environment (read now, so a
    changed HF_HOME in this process counts)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def is_path(name: str) -> bool:
    """A value that can only be a path (hub ids look like org/name)."""
    return name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf") or \
        Path(name).expanduser().exists()


_COMMIT = re.compile(r"[0-9a-f]{40}")


def resolved_snapshot(repo: str, revision: str | None) -> str | None:
    """The commit hash of the snapshot of hub repository `repo` that `revision` (None = main)
    names in the local Hugging Face cache (`models--ORG--NAME/refs/<revision>`, or the revision
    itself when it is a commit), when that snapshot folder exists; None otherwise (not cached,
    or a local path / GGUF file: nothing to resolve). From files only: what a launched server
    or `huggingface_hub` loads offline, and what `python jobs/data.py models` just fetched."""
    if is_path(repo) or repo.count("/") != 1:
        return None
    folder = hub_cache_dir() / ("models--" + repo.replace("/", "--"))
    if revision and _COMMIT.fullmatch(revision):
        commit: str | None = revision
    else:
        ref = folder / "refs" / (revision or "main")
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    if commit and _COMMIT.fullmatch(commit) and (folder / "snapshots" / commit).is_dir():
        return commit
    return None
