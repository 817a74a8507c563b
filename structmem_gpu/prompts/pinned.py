"""The official checkouts the replication experiments read, pinned (docs/evaluation.md "Official texts").

`python jobs/data.py official` fetches each repository below as a bare git repository
`<paths.official_dir>/<folder>` holding its pinned commit (verified); the replication
experiments (conf/experiment/*.yaml) name them with

    prompts.sources.lightmem: ${official_source:lightmem,${paths.official_dir}}

which resolves to `<official_dir>/lightmem.git@<commit>` (prompts/sources.py reads files with
`git show <commit>:<file>`). `paths.official_dir` defaults to the environment variable
STRUCTMEM_OFFICIAL_DIR, else `<paths.data_dir>/official`: one variable names a folder holding
lightmem.git, mem0.git, longmemeval.git and locomo-audit.git (tests and CI point it at a shared
copy).
`prompts.sources.<name>=null` runs on our own wording instead (the report says which).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from structmem_gpu.core.errors import ConfigError

RESOLVER = "official_source"
FETCH_COMMAND = "python jobs/data.py official"


@dataclass(frozen=True)
class Pin:
    folder: str  # the bare repository's folder under paths.official_dir
    url: str  # where `jobs/data.py official` fetches it from
    commit: str  # full hash; the texts are read at exactly this commit


PINNED: dict[str, Pin] = {
    # zjunlp/LightMem: the StructMem reference code (build prompts, reader, judge copy,
    # the offline update prompt).
    "lightmem": Pin("lightmem.git", "https://github.com/zjunlp/LightMem.git",
                    "8fc9a9179f9170c4a40fc653fcb410375900f26e"),
    # mem0ai/mem0 at the parent of 9315e30, where evaluation/ (the LoCoMo judge) was retired.
    "mem0": Pin("mem0.git", "https://github.com/mem0ai/mem0.git",
                "b3ede5b7c0ac0e847b03786a603c107ac943b3ee"),
    # xiaowu0162/LongMemEval: get_anscheck_prompt's per-type judge templates.
    "longmemeval": Pin("longmemeval.git", "https://github.com/xiaowu0162/LongMemEval.git",
                       "9e0b455f4ef0e2ab8f2e582289761153549043fc"),
    # dial481/locomo-audit (CC BY-NC 4.0: read at run time, never copied): LoCoMo's gold-answer
    # errata (errors.json, eval.errata) and the judge-leniency answer sets (ap-baseline/,
    # `jobs/report.py judge-audit`).
    "locomo_audit": Pin("locomo-audit.git", "https://github.com/dial481/locomo-audit.git",
                        "9493fb4b4af4256ed17a18e8fd0b3cfdeec29539"),
}


def source(name: str, official_dir: str) -> str:
    """`<official_dir>/<folder>@<commit>`: the prompts.sources spec of a pinned checkout."""
    if name not in PINNED:
        raise ConfigError(f"${{{RESOLVER}:{name},...}}: unknown source; expected one of {sorted(PINNED)}")
    pin = PINNED[name]
    return f"{Path(str(official_dir)) / pin.folder}@{pin.commit}"


def missing_line(where: str, path: Path, key: str) -> str:
    """The one line a job without a pinned checkout stops on (`where`: key=spec)."""
    return (f"{where}: {path} does not exist (the official checkouts are not fetched); fetch them "
            f"with `{FETCH_COMMAND}` (paths.official_dir / STRUCTMEM_OFFICIAL_DIR names the "
            f"folder), or set {key}=null to run on our own wording")


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # safe.directory=*: a shared read-only checkout may belong to another user; git would
    # otherwise stop with "dubious ownership" (passed per command, the user's config untouched)
    cmd = ["git", "-c", "safe.directory=*", *(["-C", str(cwd)] if cwd else []), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise ConfigError("git is not installed: the official checkouts need it") from e


def holds(repo: Path, commit: str) -> bool:
    """Whether `repo` is a git repository holding `commit`."""
    if not repo.is_dir():
        return False
    out = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=repo)
    return out.returncode == 0 and out.stdout.strip() == commit


def official_dir_default(data_dir: Path) -> Path:
    """paths.official_dir as conf/paths/default.yaml resolves it, seen from jobs/data.py."""
    env = os.environ.get("STRUCTMEM_OFFICIAL_DIR")
    return Path(env) if env else Path(data_dir) / "official"


def fetch(name: str, official_dir: Path, source: str | None = None) -> tuple[Path, bool]:
    """Make `<official_dir>/<folder>` a bare repository holding the pinned commit: fetched
    from `source` (a URL or a local repository; default the public one) into a temporary
    bare repository, verified, its HEAD set to the commit, then renamed into place. Returns
    (path, fetched now). A ConfigError names the repository and what failed."""
    pin = PINNED[name]
    dest = Path(official_dir) / pin.folder
    if holds(dest, pin.commit):
        return dest, False
    if dest.exists():
        raise ConfigError(f"{dest} exists but does not hold {name} commit {pin.commit[:12]}; "
                          "move it away and fetch again")
    url = source or pin.url
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{pin.folder}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        steps = [("init", "--bare", "--quiet", str(tmp))]
        for step in steps:
            out = _git(*step)
            if out.returncode != 0:
                raise ConfigError(f"{name}: git {step[0]} failed: {out.stderr.strip()}")
        # The commit itself, shallow (GitHub serves any commit by hash); a server that does
        # not, e.g. a plain local repository, gets a fetch of all its branches and tags.
        out = _git("fetch", "--quiet", "--depth", "1", url, pin.commit, cwd=tmp)
        if out.returncode != 0:
            out = _git("fetch", "--quiet", url, "+refs/heads/*:refs/heads/*",
                       "+refs/tags/*:refs/tags/*", cwd=tmp)
        if not holds(tmp, pin.commit):
            detail = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "not found"
            raise ConfigError(f"{name}: commit {pin.commit} could not be fetched from {url} "
                              f"({detail})")
        for step in (("update-ref", "refs/heads/pinned", pin.commit),
                     ("symbolic-ref", "HEAD", "refs/heads/pinned")):
            out = _git(*step, cwd=tmp)
            if out.returncode != 0:
                raise ConfigError(f"{name}: git {step[0]} failed: {out.stderr.strip()}")
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest, True
