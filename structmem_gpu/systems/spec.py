"""What a baseline memory system is to the job: one `SystemSpec` per system module.

    from structmem_gpu.systems.registry import system_spec
    spec = system_spec("mem0")   # structmem_gpu/systems/mem0.py: SPEC

A system is its module here (its spec: pins, worker, offline switches, scripted replies), its
worker under systems/workers/ (run in the system's own environment), its lock file under
systems/locks/ and its method YAML (conf/method/<name>.yaml, `system.name`). Adding a system
adds those four files and edits no list (systems/registry.py finds the module by name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYSTEMS_DIR = Path(__file__).resolve().parent
WORKERS_DIR = SYSTEMS_DIR / "workers"
LOCKS_DIR = SYSTEMS_DIR / "locks"

# A scripted reply for one chat-completion body a system sent: the assistant message (a dict
# with "content" and/or "tool_calls"). Unit tests and the CI tier answer the system's own
# prompts this way; everything else goes to the real backend.
ScriptedReply = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class SystemSpec:
    name: str  # the system's name (conf/method/<name>.yaml system.name)
    title: str  # how the papers' tables name it ("Mem0", "Mem0^g", ...)
    # The top-level pins `python jobs/data.py systems lock NAME` resolves; the committed lock
    # (locks/<name>.txt, every package with its version) is what `systems install` installs.
    requirements: tuple[str, ...]
    worker: str  # file name under systems/workers/
    source: str  # where its code comes from: "pypi:mem0ai==1.0.5" or "git:<repo>@<commit>"
    # Environment variables the worker runs with: telemetry off, run-time installs off.
    env: Mapping[str, str] = field(default_factory=dict)
    # Install arguments beyond the lock (e.g. --no-deps for a package whose pins do not
    # resolve), in `pip install` order: each tuple is one pip call.
    extra_installs: tuple[tuple[str, ...], ...] = ()
    scripted_reply: ScriptedReply | None = None
    # What the paper's row uses that differs from the system's defaults (docs/methods.md
    # "Baseline systems from their own code").
    paper_settings: str = ""
    # Worker options (hello's `settings`) that make this system a variant of another one run by
    # the same code (Mem0^g = mem0 with graph=true): conf/method's system.options adds to them.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Job-side preparation before workers start: files the system would download at run time
    # (tiktoken encodings) made local under the workers' home; returns environment additions.
    prepare: Callable[[Path], Mapping[str, str]] | None = None
    # A system released as a repository, not a package: (folder under paths.official_dir,
    # commit), e.g. ("amem.git", "0c8039f"). `systems install` exports that commit's tree into
    # <env>/src (read from the user's checkout, as the official texts are; never copied into
    # this repository) and the worker finds it through STRUCTMEM_SYSTEM_SRC.
    repository: tuple[str, str] | None = None
    # Where that repository is published (said by `systems install` when the folder is
    # missing: clone it there as a bare repository); None = not said.
    repository_url: str | None = None
    # Which test tier runs it: "ci" (the systems tier, `make systems` installs it) or "heavy"
    # (too slow or large for CI: marker systems_heavy, run by hand). The Makefile's install list
    # and both tiers' test lists read it (`python jobs/data.py systems install ci`).
    tier: str = "ci"
    # Another system whose environment (and lock) this one runs in: None = its own.
    shares_env_of: str | None = None

    @property
    def env_name(self) -> str:
        return self.shares_env_of or self.name

    @property
    def lock_path(self) -> Path:
        return LOCKS_DIR / f"{self.env_name}.txt"

    @property
    def worker_path(self) -> Path:
        return WORKERS_DIR / self.worker
