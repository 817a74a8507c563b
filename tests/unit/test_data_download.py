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

from structmem_gpu.core.errors import InputError

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


# ---- `models`: a job's models fetched ahead (snapshot_download replaced, never the network) --


@pytest.fixture()
def empty_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "hf" / "hub"


def fake_snapshot_download(calls: list[dict]):  # noqa: ANN201
    """Writes what a download would: a complete snapshot in the HF cache."""

    def download(repo_id: str, *, revision=None, cache_dir=None, allow_patterns=None, **kw):  # noqa: ANN001, ANN202
        calls.append({"repo": repo_id, "allow_patterns": allow_patterns, **kw})
        base = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        snap = base / "snapshots" / ("b" * 40)
        snap.mkdir(parents=True)
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text("b" * 40)
        (snap / "config.json").write_text("{}")
        (snap / "tokenizer.json").write_text("{}")
        if allow_patterns is None:
            (snap / "model.safetensors").write_text("w")
        return str(snap)

    return download


def test_models_is_a_subcommand_and_check_names_what_is_missing(
    job: ModuleType, empty_hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = job.main(["models", "--check", "debug=scripted", "embedder=qwen3_embedding_0_6b",
                   "++embedder.weights_gb=1.2"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out.splitlines()[0].startswith("1 model(s); to download: 1, 1.2 GB")  # size first
    assert "Qwen/Qwen3-Embedding-0.6B  [embedder.model]  to download" in out
    assert "error: missing: Qwen/Qwen3-Embedding-0.6B (embedder.model)" in err
    assert "fix: python jobs/data.py models debug=scripted embedder=qwen3_embedding_0_6b" in err
    assert job.main(["models", "--check", "debug=scripted"]) == 0  # packaged MiniLM: local


def test_models_downloads_each_missing_model_then_check_passes(
    job: ModuleType, empty_hub: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    calls: list[dict] = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download(calls))
    args = ["debug=scripted", "embedder=qwen3_embedding_0_6b", "extract.window_tokenizer=org/tok"]
    assert job.main(["models", *args]) == 0, capsys.readouterr()
    assert [(c["repo"], c["allow_patterns"] is None) for c in calls] == [
        ("Qwen/Qwen3-Embedding-0.6B", True), ("org/tok", False)]
    assert "tokenizer.json" in calls[1]["allow_patterns"]  # tokenizer files only, no weights
    assert not any(p.endswith(".safetensors") for p in calls[1]["allow_patterns"])
    calls.clear()
    assert job.main(["models", "--check", *args]) == 0
    assert job.main(["models", *args]) == 0 and calls == []  # nothing left to fetch


def test_models_of_a_sweep_cover_every_point(
    job: ModuleType, empty_hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert job.main(["models", "--check", "-m", "debug=scripted",
                     "embedder=qwen3_embedding_0_6b,bge_m3"]) == 2
    err = capsys.readouterr().err
    assert "Qwen/Qwen3-Embedding-0.6B (embedder.model)" in err and "BAAI/bge-m3 (embedder.model)" in err
    points = job.sweep_points(["experiment=entries_k_sweep"])  # the experiment's own params
    assert len(points) == 6 and ["retrieve.entries_k=10", "experiment=entries_k_sweep"] in points
