"""`python jobs/data.py official`: the pinned reference checkouts fetched as bare repositories,
each commit verified, from local mirrors standing in for the code host (STRUCTMEM_OFFICIAL_DIR,
e.g. the shared bare mirrors; skipped without it). No network."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from structmem_gpu.prompts import pinned
from structmem_gpu.prompts import sources as S
from tests.unit.test_data_download import job  # noqa: F401  (the jobs/data.py module fixture)


@pytest.fixture
def mirrors() -> Path:
    root = os.environ.get("STRUCTMEM_OFFICIAL_DIR")
    if not root or not all((Path(root) / p.folder).is_dir() for p in pinned.PINNED.values()):
        pytest.skip("STRUCTMEM_OFFICIAL_DIR holds no mirrors to fetch from")
    return Path(root)


def test_official_fetches_verifies_and_is_idempotent(
    job: ModuleType, mirrors: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "official"
    assert job.main(["official", "--from", str(mirrors), "--official-dir", str(dest)]) == 0
    out = capsys.readouterr().out
    assert out.count("(fetched)") == len(pinned.PINNED) and f"official checkouts in {dest}" in out
    for name, pin in pinned.PINNED.items():
        repo = dest / pin.folder
        assert pinned.holds(repo, pin.commit)
        bare = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-bare-repository"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert bare == "true"
        # what the replication experiments read: ${official_source:NAME,DIR}
        src = S.parse(f"prompts.sources.{name}", pinned.source(name, str(dest)))
        assert S.resolved_commit(src) == pin.commit
    assert job.main(["official", "--from", str(mirrors), "--official-dir", str(dest)]) == 0
    assert capsys.readouterr().out.count("(present)") == len(pinned.PINNED)
    assert job.main(["official", "--check", "--official-dir", str(dest)]) == 0


def test_official_check_and_bad_folders_fail_with_one_line(
    job: ModuleType, mirrors: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert job.main(["official", "--check", "--official-dir", str(tmp_path / "none")]) == 1
    assert "python jobs/data.py official" in capsys.readouterr().err
    # a folder in the way that is not the pinned repository: refused, never overwritten
    (tmp_path / "x" / "lightmem.git").mkdir(parents=True)
    assert job.main(["official", "--from", str(mirrors), "--official-dir", str(tmp_path / "x")]) == 2
    assert "does not hold lightmem commit" in capsys.readouterr().err
    # a source without the commit: nothing left behind
    empty = tmp_path / "empty"
    for pin in pinned.PINNED.values():
        subprocess.run(["git", "init", "--bare", "-q", str(empty / pin.folder)], check=True)
    assert job.main(["official", "--from", str(empty), "--official-dir", str(tmp_path / "y")]) == 2
    assert "could not be fetched" in capsys.readouterr().err
    assert not any((tmp_path / "y").iterdir())
