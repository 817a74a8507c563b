"""A baseline system's environment (structmem_gpu/systems/envs.py): the job refuses one that is
missing, installed from another lock or holding another commit of the system's repository,
each with one line naming the install command; a repository-released system's pinned commit
is exported from a bare, read-only checkout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.systems import envs
from structmem_gpu.systems.registry import system_names, system_spec
from structmem_gpu.systems.spec import SystemSpec


def _spec(tmp_path: Path, **kw) -> SystemSpec:
    spec = SystemSpec(name="fake", title="Fake", requirements=("x==1",), worker="w.py",
                      source="test", **kw)
    return spec


@pytest.fixture
def lock(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "fake.txt").write_text("x==1\n")
    monkeypatch.setattr("structmem_gpu.systems.spec.LOCKS_DIR", locks)
    return locks / "fake.txt"


def _state(systems: Path, **fields) -> None:
    env = systems / "fake"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / envs.STATE_FILE).write_text(json.dumps(fields))


def test_missing_stale_and_current_environments(tmp_path, lock):
    spec = _spec(tmp_path)
    systems = tmp_path / "systems"
    with pytest.raises(ConfigError, match="no environment at .*systems install fake"):
        envs.check_env(spec, systems)
    _state(systems, lock_sha256="another")
    with pytest.raises(ConfigError, match="installed from another lock .*systems install fake"):
        envs.check_env(spec, systems)
    (systems / "fake" / envs.STATE_FILE).write_text(
        json.dumps({"lock_sha256": envs.lock_sha256(spec)}))
    assert envs.check_env(spec, systems)["lock_sha256"] == envs.lock_sha256(spec)


def _repo(tmp_path: Path) -> tuple[Path, str]:
    work = tmp_path / "work"
    work.mkdir()
    run = lambda *a: subprocess.run(["git", "-C", str(work), *a], check=True,  # noqa: E731
                                    capture_output=True, text=True).stdout.strip()
    run("init", "-q")
    (work / "memory_layer.py").write_text("X = 1\n")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    commit = run("rev-parse", "HEAD")
    bare = tmp_path / "official" / "fake.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare, commit


def test_a_repository_system_exports_its_pinned_commit_and_checks_it(tmp_path, lock):
    bare, commit = _repo(tmp_path)
    spec = _spec(tmp_path, repository=("fake.git", commit[:7]))
    dest = tmp_path / "src"
    assert envs.export_repository(spec, tmp_path / "official", dest) == commit
    assert (dest / "memory_layer.py").read_text() == "X = 1\n"
    systems = tmp_path / "systems"
    _state(systems, lock_sha256=envs.lock_sha256(spec), commit="0" * 40)
    with pytest.raises(ConfigError, match=f"not the pinned {commit[:7]}"):
        envs.check_env(spec, systems)
    missing = _spec(tmp_path, repository=("absent.git", "abc"))
    with pytest.raises(ConfigError, match="absent.git is missing"):
        envs.export_repository(missing, tmp_path / "official", dest)


def test_install_refuses_a_missing_repository_first_saying_how_to_get_it(tmp_path, lock):
    """One line naming the path and the clone command, before any environment is touched."""
    spec = _spec(tmp_path, repository=("absent.git", "abc"),
                 repository_url="https://example.org/absent")
    systems = tmp_path / "systems"
    (systems / "fake").mkdir(parents=True)
    (systems / "fake" / "kept").write_text("x")
    with pytest.raises(ConfigError) as err:
        envs.install(spec, systems, official_dir=tmp_path / "official")
    where = tmp_path / "official" / "absent.git"
    assert f"git clone --bare https://example.org/absent {where}" in str(err.value)
    assert "\n" not in str(err.value)
    assert (systems / "fake" / "kept").exists()  # the environment there is left alone


def test_every_packaged_system_has_its_lock_worker_and_method() -> None:
    root = Path(__file__).resolve().parents[2]
    names = system_names()
    assert "mem0" in names and "mem0_graph" in names
    for name in names:
        spec = system_spec(name)
        assert spec.name == name
        assert spec.lock_path.exists(), f"{name}: no lock {spec.lock_path}"
        assert spec.worker_path.exists(), f"{name}: no worker {spec.worker_path}"
        assert (root / "conf" / "method" / f"{name}.yaml").exists(), f"{name}: no method YAML"
    with pytest.raises(ConfigError, match="expected one of"):
        system_spec("front")  # machinery, not a system


def test_the_systems_command_lists_and_refuses_an_unknown_name(tmp_path, capsys) -> None:
    from structmem_gpu.systems.admin import systems_command

    assert systems_command(["list", "--systems-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mem0 " in out and "pypi:mem0ai==1.0.5" in out and "not installed" in out
    assert systems_command(["install", "nosuchsystem", "--systems-dir", str(tmp_path)]) == 2


def test_the_makefile_systems_command_parses(tmp_path, capsys) -> None:
    """The Makefile's own argument order (option before the names) is accepted: CI ran
    `systems install --systems-dir D ci` and argparse refused `ci` before parse_intermixed_args."""
    import re
    import shlex

    from structmem_gpu.systems.admin import systems_command
    from structmem_gpu.systems.registry import system_names

    root = Path(__file__).resolve().parents[2]
    line = next(ln for ln in (root / "Makefile").read_text().splitlines()
                if ln.startswith("\t") and "jobs/data.py systems install" in ln)
    argv = shlex.split(line.split("jobs/data.py", 1)[1].split(";", 1)[0])
    assert argv[:2] == ["systems", "install"]
    argv = ["list"] + [str(tmp_path) if a == "$(STRUCTMEM_SYSTEMS_DIR)" else
                       re.sub(r"\$\(CI_SYSTEMS\)", "ci", a) for a in argv[2:]]
    assert systems_command(argv) == 0
    listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert listed == system_names("ci")


def test_a_tier_skips_a_repository_system_without_its_checkout(tmp_path, monkeypatch) -> None:
    """`systems install ci` (make systems) skips a repository-released system of the tier whose
    checkout is not in STRUCTMEM_OFFICIAL_DIR (its tests skip too), with a warning; named on
    the command line, it is installed or fails."""
    from structmem_gpu.systems.admin import systems_command

    installed: list[str] = []

    def install(spec, where, *, official_dir):  # records, installs nothing
        installed.append(spec.name)
        return {"installed_s": 0.0}

    monkeypatch.setattr(envs, "install", install)
    monkeypatch.setenv("STRUCTMEM_OFFICIAL_DIR", str(tmp_path / "official"))
    ci = system_names("ci")
    assert "seem_skill" in ci and system_spec("seem_skill").repository is not None
    assert systems_command(["install", "--systems-dir", str(tmp_path / "s"), "ci"]) == 0
    assert "seem_skill" not in installed and installed
    assert all(system_spec(n).repository is None for n in installed)
    installed.clear()
    assert systems_command(["install", "seem_skill", "--systems-dir", str(tmp_path / "s")]) == 0
    assert installed == ["seem_skill"]
