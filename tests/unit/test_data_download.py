"""jobs/data.py: checksum verification, sidecars and atomic downloads, with a fake fetcher.

The tests never touch the network: `fetch` is replaced by a function that writes local bytes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from structmem_gpu.errors import InputError

JOB = Path(__file__).resolve().parents[2] / "jobs" / "data.py"


@pytest.fixture(scope="module")
def job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("structmem_jobs_data", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _fetcher(payload: bytes, calls: list[str]):
    def fetch(url: str, dest: Path) -> None:
        calls.append(url)
        dest.write_bytes(payload)

    return fetch


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_published_checksum_verified(job, tmp_path: Path) -> None:
    ds = job.Dataset("bench.json", "https://example.invalid/bench.json", _sha(b"good"))
    calls: list[str] = []
    target = job.ensure(ds, tmp_path, fetch=_fetcher(b"good", calls))
    assert target.read_bytes() == b"good" and len(calls) == 1
    job.ensure(ds, tmp_path, fetch=_fetcher(b"good", calls))  # present and valid: no download
    assert len(calls) == 1
    assert not (tmp_path / "bench.json.sha256").exists()  # published checksums need no sidecar
    assert job.check(ds, tmp_path)


def test_bad_download_leaves_nothing(job, tmp_path: Path) -> None:
    ds = job.Dataset("bench.json", "https://example.invalid/bench.json", _sha(b"good"))
    with pytest.raises(InputError, match="downloaded sha256 .* != published"):
        job.ensure(ds, tmp_path, fetch=_fetcher(b"tampered", []))
    assert list(tmp_path.iterdir()) == []


def test_interrupted_download_leaves_nothing(job, tmp_path: Path) -> None:
    ds = job.Dataset("bench.json", "https://example.invalid/bench.json", None)

    def dies(url: str, dest: Path) -> None:
        dest.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        job.ensure(ds, tmp_path, fetch=dies)
    assert list(tmp_path.iterdir()) == []


def test_existing_file_with_wrong_checksum(job, tmp_path: Path) -> None:
    ds = job.Dataset("bench.json", "https://example.invalid/bench.json", _sha(b"good"))
    (tmp_path / "bench.json").write_bytes(b"edited")
    with pytest.raises(InputError, match="use --force"):
        job.ensure(ds, tmp_path, fetch=_fetcher(b"good", []))
    assert not job.check(ds, tmp_path)
    job.ensure(ds, tmp_path, fetch=_fetcher(b"good", []), force=True)
    assert (tmp_path / "bench.json").read_bytes() == b"good"


def test_unpublished_checksum_recorded_then_verified(job, tmp_path: Path) -> None:
    ds = job.Dataset("lme.json", "https://example.invalid/lme.json", None)
    assert not job.check(ds, tmp_path)  # missing
    job.ensure(ds, tmp_path, fetch=_fetcher(b"v1", []))
    side = tmp_path / "lme.json.sha256"
    assert side.read_text() == f"{_sha(b'v1')}  lme.json\n"  # sha256sum -c format
    assert job.check(ds, tmp_path)
    (tmp_path / "lme.json").write_bytes(b"corrupted")
    assert not job.check(ds, tmp_path)
    with pytest.raises(InputError, match="!= expected"):
        job.ensure(ds, tmp_path, fetch=_fetcher(b"v1", []))
    # Upstream changed: a forced download accepts the new bytes and re-records the sidecar.
    job.ensure(ds, tmp_path, fetch=_fetcher(b"v2", []), force=True)
    assert side.read_text().split()[0] == _sha(b"v2")


def test_present_file_without_sidecar_is_recorded(job, tmp_path: Path) -> None:
    ds = job.Dataset("lme.json", "https://example.invalid/lme.json", None)
    (tmp_path / "lme.json").write_bytes(b"copied by hand")
    assert not job.check(ds, tmp_path)  # unverifiable until recorded
    job.ensure(ds, tmp_path, fetch=_fetcher(b"unused", []))
    assert job.check(ds, tmp_path)


def test_cli(job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"locomo bytes"
    monkeypatch.setitem(
        job.DATASETS,
        "locomo",
        job.Dataset("locomo10.json", "https://example.invalid/l", _sha(payload)),
    )
    args = ["--data-dir", str(tmp_path)]
    assert job.main(["--check", *args]) == 1
    assert job.main(args, fetch=_fetcher(b"wrong", [])) == 2
    assert not (tmp_path / "locomo10.json").exists()
    assert job.main(["locomo", *args], fetch=_fetcher(payload, [])) == 0
    assert job.main(["--check", "locomo", *args]) == 0
    with pytest.raises(SystemExit):
        job.main(["nope", *args])


def test_real_locomo_entry_matches_spec(job) -> None:
    ds = job.DATASETS["locomo"]
    assert ds.sha256 == "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
    assert ds.url.endswith("snap-research/LoCoMo/main/data/locomo10.json")
    assert all(
        job.DATASETS[n].url.startswith(
            "https://huggingface.co/datasets/xiaowu0162/longmemeval-cleaned/"
        )
        for n in ("longmemeval_s", "longmemeval_m", "longmemeval_oracle")
    )
