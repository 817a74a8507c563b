"""One virtual environment per baseline system, installed from its committed lock.

    python jobs/data.py systems install mem0         # <systems_dir>/mem0/ from locks/mem0.txt
    python jobs/data.py systems download mem0        # wheels only (a login node with network)
    python jobs/data.py systems install mem0         # ... then on the offline node: from them
    python jobs/data.py systems lock mem0            # re-resolve the spec's pins (maintainers)
    python jobs/data.py systems list                 # every system, its pin and its env's state

The systems' pins conflict with ours and with each other (mem0ai 1.0.x and langmem want other
openai versions than graphiti; hipporag's own pins do not resolve), so each lives in
`<systems_dir>/<name>/` (paths.systems_dir: STRUCTMEM_SYSTEMS_DIR, else <root>/.systems) and
runs there as worker processes (systems/pool.py). The lock (systems/locks/<name>.txt) is
`pip freeze` of a resolved install: every package pinned, so `install` uses `--no-deps` and
needs no resolver; `<env>/structmem_system.json` records the lock's sha256, the Python and the
install time, and a job refuses an environment whose lock changed since (the manifest records
it). Downloaded wheels go to `<systems_dir>/wheels/<name>/`; an install finds them there first
and, when they are complete, installs with `--no-index` (no network at all).
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.systems.spec import SystemSpec

STATE_FILE = "structmem_system.json"


def lock_sha256(spec: SystemSpec) -> str:
    return hashlib.sha256(spec.lock_path.read_bytes()).hexdigest()


def env_dir(spec: SystemSpec, systems_dir: Path) -> Path:
    return Path(systems_dir).absolute() / spec.env_name


def env_python(spec: SystemSpec, systems_dir: Path) -> Path:
    return env_dir(spec, systems_dir) / "bin" / "python"


def wheels_dir(spec: SystemSpec, systems_dir: Path) -> Path:
    return Path(systems_dir) / "wheels" / spec.env_name


def env_state(spec: SystemSpec, systems_dir: Path) -> dict[str, Any] | None:
    path = env_dir(spec, systems_dir) / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def check_env(spec: SystemSpec, systems_dir: Path) -> dict[str, Any]:
    """The installed environment's record; ConfigError (one line, the command to fix it) when
    it is missing or was installed from another lock."""
    state = env_state(spec, systems_dir)
    fix = f"python jobs/data.py systems install {spec.env_name}"
    if state is None or not env_python(spec, systems_dir).exists():
        raise ConfigError(f"system {spec.name}: no environment at "
                          f"{env_dir(spec, systems_dir)}; run `{fix}` (paths.systems_dir / "
                          f"STRUCTMEM_SYSTEMS_DIR say where)")
    pinned = spec.repository[1] if spec.repository else None
    if pinned and not str(state.get("commit") or "").startswith(pinned):
        raise ConfigError(f"system {spec.name}: {env_dir(spec, systems_dir)} holds commit "
                          f"{state.get('commit')} of {spec.repository[0]}, not the pinned "
                          f"{pinned}; run `{fix}` again")
    if state.get("lock_sha256") != lock_sha256(spec):
        raise ConfigError(f"system {spec.name}: {env_dir(spec, systems_dir)} was installed from "
                          f"another lock than {spec.lock_path.name}; run `{fix}` again")
    return state


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    subprocess.run(cmd, check=True)


def source_dir(spec: SystemSpec, systems_dir: Path) -> Path:
    """Where a repository-released system's code is exported (spec.repository)."""
    return env_dir(spec, systems_dir) / "src"


def repository_path(spec: SystemSpec, official_dir: Path) -> Path:
    """`<official_dir>/<folder>` of a repository-released system; ConfigError (one line: how to
    get it) when it is missing."""
    folder = (spec.repository or ("", ""))[0]
    repo = Path(official_dir) / folder
    if not repo.exists():
        how = (f"clone {spec.repository_url} as a bare repository there (git clone --bare "
               f"{spec.repository_url} {repo})" if spec.repository_url else
               f"put a clone (bare) of {spec.title}'s repository there")
        raise ConfigError(f"system {spec.name}: its repository {repo} is missing; {how}, or "
                          f"point STRUCTMEM_OFFICIAL_DIR at a folder holding {folder}")
    return repo


def export_repository(spec: SystemSpec, official_dir: Path, dest: Path) -> str:
    """`git archive` of the pinned commit of the system's repository into `dest`; returns the
    full commit. The checkout may be bare, read-only and owned by someone else."""
    commit = (spec.repository or ("", ""))[1]
    repo = repository_path(spec, official_dir)
    git = ["git", "-c", f"safe.directory={repo}", "-C", str(repo)]
    full = subprocess.run([*git, "rev-parse", "--verify", f"{commit}^{{commit}}"], check=True,
                          capture_output=True, text=True).stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run([*git, "archive", "--format=tar", full], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return full


def install(spec: SystemSpec, systems_dir: Path, *, python: str = sys.executable,
            official_dir: Path | None = None) -> dict[str, Any]:
    """(Re)create the system's environment from its lock; returns the state it recorded."""
    target = env_dir(spec, systems_dir)
    t0 = time.monotonic()
    official = Path(official_dir or "data/official")
    if spec.repository is not None:
        repository_path(spec, official)  # missing: say so before anything is removed or built
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(target)], check=True)
    py = env_python(spec, systems_dir)
    wheels = wheels_dir(spec, systems_dir)
    find = ["--find-links", str(wheels)] if wheels.is_dir() else []
    offline = ["--no-index"] if (wheels / ".complete").exists() else []
    # Every package is in the lock: no resolver, no surprise upgrade (hipporag's own pins do
    # not resolve; its lock holds what runs).
    _pip(py, "--no-deps", *find, *offline, "-r", str(spec.lock_path))
    for extra in spec.extra_installs:
        _pip(py, *find, *offline, *extra)
    commit = None
    if spec.repository is not None:
        commit = export_repository(spec, official, source_dir(spec, systems_dir))
    version = subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    state = {"system": spec.name, "source": spec.source, "lock": spec.lock_path.name,
             "lock_sha256": lock_sha256(spec), "python": version, "commit": commit,
             "installed_s": round(time.monotonic() - t0, 1), "installed_at": time.time(),
             "platform": platform.platform()}
    (target / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
    return state


def download(spec: SystemSpec, systems_dir: Path, *, python: str = sys.executable) -> Path:
    """Fetch the lock's wheels (a login node with network) for an offline `install`."""
    dest = wheels_dir(spec, systems_dir)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest),
                    "-r", str(spec.lock_path)], check=True)
    (dest / ".complete").write_text(lock_sha256(spec) + "\n")
    return dest


def lock(spec: SystemSpec, *, python: str = sys.executable) -> Path:
    """Resolve the spec's pins in a scratch environment and write its `pip freeze` as the lock."""
    with tempfile.TemporaryDirectory(prefix=f"lock-{spec.name}-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        py = venv / "bin" / "python"
        _pip(py, *spec.requirements)
        frozen = subprocess.run([str(py), "-m", "pip", "freeze", "--all", "--exclude", "pip",
                                 "--exclude", "setuptools", "--exclude", "wheel"], check=True,
                                capture_output=True, text=True).stdout
        version = subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
    header = (f"# {spec.name}: pip freeze of `pip install {' '.join(spec.requirements)}` "
              f"(python {version}); written by `python jobs/data.py systems lock {spec.name}`\n")
    spec.lock_path.parent.mkdir(parents=True, exist_ok=True)
    spec.lock_path.write_text(header + frozen)
    return spec.lock_path
