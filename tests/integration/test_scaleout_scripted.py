"""Scale-out behaviour that needs no model server (scripted LLM + MiniLM, in-process):

- a sweep over consolidation/retrieval knobs repeats no extraction and no embedding;
- a job that died at any point between writing a table and writing its manifest entry (or
  left a half-written temp file behind) finishes with the same tables when rerun.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from tests.fixtures.pipeline import run_pipeline

SMALL = [
    "debug=scripted",
    "benchmark=sample",
    "benchmark.conversations=[sample-1]",
    "benchmark.max_sessions=3",
    "method=structmem",
]
BUILD = "stages=[load,extract,embed,consolidate,retrieve]"
# Six scripted pipeline runs and a crash matrix: heavy for the gate, no server needed.
pytestmark = pytest.mark.e2e


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns)


@pytest.mark.parametrize(
    "knob",
    [
        "consolidate.seed_k=0",
        "consolidate.window_seconds=2592000",
        "retrieve.entries_k=5",
        "retrieve.syntheses_k=1",
        "consolidate.prompt_variant=unconstrained",
    ],
)
def test_sweep_point_repeats_no_extraction_or_embedding(
    knob: str, tmp_path_factory: pytest.TempPathFactory, warm_cache: Path
) -> None:
    run_dir = tmp_path_factory.mktemp("point")
    run_pipeline([*SMALL, f"paths.cache_dir={warm_cache}", BUILD, knob], run_dir)
    run = RunDir(run_dir)
    req = run.read_table("requests")
    extract = req.filter(pl.col("stage") == "extract")
    assert extract.height > 0 and extract["cache_hit"].all() and extract["attempts"].sum() == 0
    embed = run.stage_entry("embed")
    assert embed is not None and embed["notes"]["embedded_new"] == 0
    if knob.startswith("retrieve."):  # consolidation does not read retrieve.*: cached too
        assert req.filter(pl.col("stage") == "consolidate")["cache_hit"].all()


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("sweep-cache")
    run_pipeline([*SMALL, f"paths.cache_dir={cache}", BUILD], tmp_path_factory.mktemp("base"))
    return cache


# ---- resume after a crash at any point of a stage's write sequence ---------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, warm_cache: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    run_pipeline([*SMALL, f"paths.cache_dir={warm_cache}", BUILD], run_dir)
    return run_dir


def _tables(run_dir: Path) -> dict[str, pl.DataFrame]:
    run = RunDir(run_dir)
    return {p.stem: run.read_table(p.stem) for p in run.tables_dir.glob("*.parquet")}


def _crash(run_dir: Path, how: str) -> None:
    """Leave the directory as a job killed at that point would."""
    run = RunDir(run_dir)
    manifest = run.load_manifest()
    if how == "after_table_before_manifest":
        # consolidate wrote its tables; the kill came before its manifest entry.
        del manifest["stages"]["consolidate"]
        del manifest["stages"]["retrieve"]
        run.tables_dir.joinpath("retrievals.parquet").unlink()
        run.save_manifest(manifest)
    elif how == "mid_parquet_write":
        # Killed inside atomic_write_parquet: a half-written temp file next to the old table.
        tmp = run.tables_dir / "entries.parquet.tmp-99999"
        tmp.write_bytes(run.table_path("entries").read_bytes()[:100])
        del manifest["stages"]["retrieve"]
        run.save_manifest(manifest)
    elif how == "table_damaged":
        # A table whose bytes no longer match its manifest entry is recomputed, not trusted.
        run.table_path("syntheses").write_bytes(b"PAR1 not really")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "redone"),
    [
        ("after_table_before_manifest", "consolidate"),
        ("mid_parquet_write", "retrieve"),
        ("table_damaged", "consolidate"),
    ],
)
def test_rerun_after_a_crash_gives_the_same_tables(
    how: str, redone: str, reference: Path, warm_cache: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [*SMALL, f"paths.cache_dir={warm_cache}", BUILD]
    run_pipeline(overrides, run_dir)
    _crash(run_dir, how)
    outcomes = {o.name: o.skipped for o in run_pipeline(overrides, run_dir)}
    assert outcomes["load"] and outcomes["extract"]  # finished stages are not redone
    assert not outcomes[redone]
    got, want = _tables(run_dir), _tables(reference)
    assert sorted(got) == sorted(want)
    for name in want:
        if name == "requests":  # same requests; how they were served (cache hits) may differ
            cols = ["request_id", "stage", "messages_hash", "reply"]
            assert _rows(got[name].select(cols)).equals(_rows(want[name].select(cols)))
        else:
            assert _rows(got[name]).equals(_rows(want[name])), name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert all(e["status"] == "done" for e in manifest["stages"].values())
