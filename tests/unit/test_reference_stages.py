"""The compress and segment stages in a job (scripted LLM, the small LLMLingua-2 stand-in of
tests/fixtures/lingua.py, the packaged MiniLM), and the defaults they leave alone.

- Defaults unchanged: with the new stages off, the sample's extraction request ids for
  method=structmem and method=flat are those the code before these stages produced (digests
  taken at commit 782e59d, the branch point).
- experiment=structmem_locomo_reference_code on the sample: load -> compress -> segment ->
  extract writes compressed_turns (one row per turn) and segments (every turn in one segment),
  sends one request pair per extraction batch in the reference's topic format, and a rerun
  skips both new stages (fingerprints unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.hashing import stable_hash
from tests.fixtures.pipeline import compose_cfg, run_pipeline

# stable_hash(sorted extract request ids) of the sample at 782e59d (before compress/segment).
DEFAULT_IDS = {
    "structmem": "91b07e8eb56752ca",  # 18 requests
    "flat": "635cdc5d5c05fbdb",  # 9 requests
}


def extract_request_ids(overrides: list[str], tmp_path: Path) -> list[str]:
    from structmem_gpu.methods.structmem.extract import (
        ExtractSettings,
        build_request,
        plan_from_settings,
    )

    cfg = compose_cfg(overrides)
    run_pipeline([*overrides, "stages=[load]", f"paths.cache_dir={tmp_path / 'c'}"], tmp_path / "run")
    turns = pl.read_parquet(tmp_path / "run" / "tables" / "turns.parquet")
    s = ExtractSettings.from_cfg(cfg)
    windows, _ = plan_from_settings(turns, s, JobConfig.from_cfg(cfg).root.llm)
    return sorted(build_request(w, k, s).request_id for k in s.perspectives for w in windows)


@pytest.mark.parametrize("method", ["structmem", "flat"])
def test_default_request_ids_are_unchanged(method: str, tmp_path: Path) -> None:
    ids = extract_request_ids(["benchmark=sample", f"method={method}"], tmp_path)
    assert stable_hash(ids) == DEFAULT_IDS[method]
    assert compose_cfg([f"method={method}"]).extract.input == "turns"
    assert "compress" not in compose_cfg([f"method={method}"]).method.stages


def reference_overrides(model: str, tmp_path: Path, *extra: str) -> list[str]:
    return ["experiment=structmem_locomo_reference_code", "benchmark=sample", "debug=scripted",
            f"compress.model={model}", "compress.device=cpu", "segment.layers=[0,1]",
            f"paths.cache_dir={tmp_path / 'c'}",
            "stages=[load,compress,segment,extract]", *extra]


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_reference_stages_on_the_sample(tiny_lingua_model: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = reference_overrides(tiny_lingua_model, tmp_path)
    run_pipeline(overrides, run)
    tables = run / "tables"
    turns = pl.read_parquet(tables / "turns.parquet")
    comp = pl.read_parquet(tables / "compressed_turns.parquet")
    segs = pl.read_parquet(tables / "segments.parquet")
    requests = pl.read_parquet(tables / "requests.parquet").filter(pl.col("stage") == "extract")
    assert comp.height == turns.height and comp["error"].null_count() == comp.height
    assert comp["compressed_tokens"].sum() < 0.8 * comp["text_tokens"].sum()  # rate 0.6
    # every turn in exactly one segment; batches within budget unless one segment exceeds it
    assert sorted(segs["event_ids"].explode().to_list()) == sorted(turns["event_id"].to_list())
    batches = segs.filter(pl.col("batch_index").is_not_null()).unique(["conv_id", "batch_index"])
    one_segment = segs.group_by("conv_id", "batch_index").len().filter(pl.col("len") == 1)
    over = batches.filter(pl.col("batch_tokens") > 512).join(one_segment, on=["conv_id", "batch_index"], how="anti")
    assert over.height == 0
    assert requests.height == 2 * batches.height
    manifest = json.loads((run / "manifest.json").read_text())
    notes = manifest["stages"]["segment"]["notes"]
    assert notes["batches"] == batches.height and notes["segments"] == segs.height
    assert manifest["stages"]["extract"]["notes"]["input"] == "segments"
    # the report names them
    from structmem_gpu.eval.report import run_protocols

    protocols = run_protocols(JobConfig.from_cfg(compose_cfg(overrides)), manifest)
    assert "rate 0.6" in protocols["compression"] and f"in {batches.height} extraction batches" in protocols["segmentation"]
    # a rerun skips the new stages
    before = {k: manifest["stages"][k]["fingerprint"] for k in ("compress", "segment")}
    run_pipeline(overrides, run)
    again = json.loads((run / "manifest.json").read_text())
    assert {k: again["stages"][k]["fingerprint"] for k in before} == before


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_reference_format_batches(tiny_lingua_model: str, tmp_path: Path) -> None:
    """With the LightMem texts (the reference's line format) every extract request shows its
    batch's topic markers and the compressed texts."""
    from tests.unit.test_segment_reference import lightmem_source

    lightmem_source("experiments/locomo/prompts.py")  # skips without the checkout
    from tests import official_repos

    spec = official_repos.spec("lightmem")
    run = tmp_path / "run"
    run_pipeline(reference_overrides(tiny_lingua_model, tmp_path, f"prompts.sources.lightmem={spec}"), run)
    from structmem_gpu.core.artifacts import RunDir

    segs = pl.read_parquet(run / "tables" / "segments.parquet")
    comp = pl.read_parquet(run / "tables" / "compressed_turns.parquet")
    log = RunDir(run).read_table("requests").filter(pl.col("stage") == "extract")
    assert log.height > 0
    from structmem_gpu.methods.structmem.extract import segment_windows, with_compressed
    from structmem_gpu.methods.structmem.prompts.reference import render_reference_batch

    turns = with_compressed(pl.read_parquet(run / "tables" / "turns.parquet"), comp)
    windows = segment_windows(turns, segs)
    assert len(windows) * 2 == log.height
    texts = [render_reference_batch(w.turns, w.topics) for w in windows]
    assert all(t.startswith("--- Topic ") for t in texts)
    assert sum(t.count("--- Topic ") for t in texts) == segs["batch_index"].is_not_null().sum()
    compressed = set(comp["compressed"].to_list())
    line_texts = [line.split(": ", 1)[1] for t in texts for line in t.splitlines() if not line.startswith("---")]
    assert set(line_texts) <= compressed


def test_our_format_gives_each_session_its_date() -> None:
    from datetime import datetime

    from structmem_gpu.methods.structmem.extract import TurnView, render_batch

    d1, d2 = datetime(2024, 3, 3, 14, 15), datetime(2024, 3, 17, 19, 5)
    turns = [TurnView("c:D1:1", "D1:1", 1, 0, d1, "Ana", "a"), TurnView("c:D1:2", "D1:2", 1, 1, d1, "Bo", "b"),
             TurnView("c:D2:1", "D2:1", 2, 0, d2, "Ana", "c")]
    text = render_batch(turns)
    assert text.count("Session date:") == 2 and "2024-03-17 19:05" in text
    assert [line for line in text.splitlines() if line.startswith("[")] == ["[1] Ana: a", "[2] Bo: b", "[3] Ana: c"]


def test_flat_reference_profile_sends_the_flat_mode_prompt() -> None:
    """add_locomo.py --extraction_mode flat: METADATA_GENERATE_PROMPT_locomo as the only
    extraction prompt; the StructMem profile keeps event mode."""
    from structmem_gpu.methods.structmem.extract import ExtractSettings

    flat = ExtractSettings.from_cfg(compose_cfg(["experiment=flat_locomo_reference_code"]))
    event = ExtractSettings.from_cfg(compose_cfg(["experiment=structmem_locomo_reference_code"]))
    assert (flat.reference_mode, tuple(flat.perspectives)) == ("flat", ("fact",))
    assert event.reference_mode == "event" and tuple(event.perspectives) == ("fact", "relation")
    assert not flat.check() and not event.check()
