"""Several sweep jobs (separate processes) writing one cache dir at once: nothing is lost,
nothing is corrupted, and a later job finds every LLM reply and every embedding.

The jobs run the real pipeline (load, extract, embed) with the scripted LLM, each in its own
run directory, all sharing `paths.cache_dir` (response cache + embedding cache, segment stores).
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.embed.cache import CACHE_FILE as EMB_FILE
from structmem_gpu.llm.cache import CACHE_FILE as LLM_FILE
from tests.fixtures.pipeline import run_pipeline


def _job(cache_dir: str, run_dir: str, extra: list[str]) -> None:
    run_pipeline(
        [
            "debug=scripted",
            f"paths.cache_dir={cache_dir}",
            "benchmark=sample",
            "stages=[load,extract,embed]",
            *extra,
        ],
        Path(run_dir),
    )


def _rows(path: Path, table: str) -> int:
    """Distinct keys of a segment store, every record checksum-verified."""
    from structmem_gpu.core import segstore

    out = segstore.verify(path)
    assert not out["damaged"], out
    return int(out["keys"])


@pytest.mark.e2e  # e2e: job subprocesses
def test_concurrent_pipeline_jobs_share_one_cache_dir(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Overlapping work: two jobs with identical requests and texts (written twice at the same
    # time) and one with another extraction window size (different requests, some equal texts).
    jobs = [[], [], ["extract.turns_per_request=4"]]
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_job, args=(str(cache), str(tmp_path / f"run{i}"), extra))
        for i, extra in enumerate(jobs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0] * len(jobs)

    def sent(i: int) -> pl.DataFrame:
        return pl.read_parquet(tmp_path / f"run{i}/tables/requests.parquet").filter(
            pl.col("stage") == "extract"
        )

    distinct = pl.concat([sent(i) for i in range(len(jobs))])["messages_hash"].n_unique()
    assert _rows(cache / "llm" / LLM_FILE, "responses") == distinct
    texts = pl.concat(
        [pl.read_parquet(tmp_path / f"run{i}/tables/entries.parquet") for i in range(len(jobs))]
    )
    assert _rows(cache / "embeddings" / EMB_FILE, "embeddings") == texts["text"].n_unique()

    # A later sweep job with any of these settings repeats no LLM or embedding work.
    _job(str(cache), str(tmp_path / "later"), ["extract.turns_per_request=4"])
    later = pl.read_parquet(tmp_path / "later/tables/requests.parquet")
    assert later.height > 0 and later["cache_hit"].all()
    same = pl.read_parquet(tmp_path / "later/tables/entries.parquet")
    ref = pl.read_parquet(tmp_path / "run2/tables/entries.parquet")
    assert same.sort("entry_id").equals(ref.sort("entry_id"))
    embed = RunDir(tmp_path / "later").stage_entry("embed")
    assert embed is not None and embed["notes"]["embedded_new"] == 0
