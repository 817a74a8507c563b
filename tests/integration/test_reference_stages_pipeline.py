"""compress -> segment -> extract of experiment=structmem_locomo_reference_code on the real
stack (llama.cpp + SmolLM2, MiniLM), with the LLMLingua-2 stand-in of tests/fixtures/lingua.py
(random weights: which words survive is meaningless, the volume follows compress.rate). The
bundled sample gives one extraction batch per conversation (each conversation's compressed
text fits one 512-token buffer): 2 batches x 2 perspectives = 4 uncached requests. Asserts
structure and provenance, never entry quality."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(900),
]


def test_compress_segment_extract_on_llamacpp(ci_overrides: list[str], tiny_lingua_model: str,
                                              tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_pipeline([*ci_overrides, "experiment=structmem_locomo_reference_code", "benchmark=sample",
                  f"compress.model={tiny_lingua_model}", "compress.device=cpu", "segment.layers=[0,1]",
                  "stages=[load,compress,segment,extract]"], run)
    tables = run / "tables"
    turns = pl.read_parquet(tables / "turns.parquet")
    comp = pl.read_parquet(tables / "compressed_turns.parquet")
    segs = pl.read_parquet(tables / "segments.parquet")
    entries = pl.read_parquet(tables / "entries.parquet")
    requests = pl.read_parquet(tables / "requests.parquet").filter(pl.col("stage") == "extract")
    assert comp.height == turns.height
    kept = set(segs.filter(pl.col("batch_index").is_not_null())["event_ids"].explode().to_list())
    batches = segs.filter(pl.col("batch_index").is_not_null()).unique(["conv_id", "batch_index"]).height
    assert requests.height == 2 * batches and requests["unanswered"].fill_null(False).sum() == 0
    assert set(entries["event_id"].to_list()) <= kept
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["extract"]["notes"]["input"] == "segments"
    assert manifest["stages"]["extract"]["notes"]["windows"] == batches
    assert manifest["stages"]["segment"]["notes"]["batches"] == batches
    assert manifest["stages"]["compress"]["notes"]["tokens_out"] < manifest["stages"]["compress"]["notes"]["tokens_in"]
