"""StructMem through the judge on a 20-question LongMemEval-M-shaped slice: the compact turns
layout gives exactly the plain layout's run (scripted LLM, hashing encoder, no server).

The plain run stands for main's layout: the load stage writes the expanded turns.parquet as
before (test_turns_store.py shows that expansion equals main's loader output row for row);
every later stage then reads `turns` through RunDir.read_table in both runs. Extraction runs
once per distinct session in the compact layout: fewer requests, the same entries (their
request_id names the shared request). Every other request id, every table the stages write
and the report's scores must be identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from structmem_gpu.bench.harness import hashing_encoder
from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.methods import load as load_stage

# 20 questions x 12 sessions of 4 turns from a pool of 60: sessions shared by ~4 haystacks.
# Both date shapes: one date per pool session (dates="fixed": shared by (turns, date), so
# extraction is shared too) and LongMemEval's recipe (dates drawn per haystack: the turns are
# stored once per content, the dated occurrences nearly all differ).
SPECS = {d: HaystackFileSpec(questions=20, sessions=12, pool=60, turns_per_session=4, dates=d)
         for d in ("fixed", "per_haystack")}
SPEC = SPECS["fixed"]
TABLES = ("questions", "entry_embeddings", "syntheses", "synthesis_embeddings",
          "retrievals", "answers", "judgments")


@pytest.fixture(scope="module", params=list(SPECS))
def two_runs(request, tmp_path_factory) -> tuple[Path, Path]:
    from tests.fixtures.pipeline import run_pipeline

    base = tmp_path_factory.mktemp(f"lme-layouts-{request.param}")
    data = write_longmemeval(SPECS[request.param], base / "m_slice.json")
    runs = []
    for layout in ("compact", "plain"):
        run_dir = base / layout
        with pytest.MonkeyPatch.context() as mp, hashing_encoder():
            if layout == "plain":
                mp.setattr(load_stage, "compact_layout", lambda name: False)
            run_pipeline(["debug=scripted", "method=structmem", "benchmark=longmemeval",
                          f"benchmark.path={data}", f"paths.cache_dir={base / layout}-cache"],
                         run_dir)
        runs.append(run_dir)
    return runs[0], runs[1]


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_layouts_store_what_they_should(two_runs) -> None:
    compact, plain = (RunDir(r) for r in two_runs)
    assert plain.table_path("turns").exists() and not compact.table_path("turns").exists()
    assert_frame_equal(compact.read_table("turns"), plain.read_table("turns"))
    stored = compact.read_table("turn_sessions").height
    assert stored < plain.read_table("turns").height  # shared sessions stored once


@pytest.mark.e2e  # e2e: reads the module's two whole scripted runs
def test_extraction_once_per_distinct_session(two_runs) -> None:
    compact, plain = (RunDir(r) for r in two_runs)
    sent = {r.root.name: r.read_table("requests").filter(pl.col("stage") == "extract")
            for r in (compact, plain)}
    notes = compact.stage_entry("extract")["notes"]
    assert sent["compact"].height == notes["requests"] == 2 * notes["windows"]
    assert notes["window_occurrences"] == plain.stage_entry("extract")["notes"]["windows"]
    if "fixed" in compact.root.parent.name:  # shared (turns, date) sessions sent once
        assert sent["compact"].height < sent["plain"].height
    else:  # the prompt carries the date: one request per dated occurrence, none merged
        assert sent["compact"].height <= sent["plain"].height
    assert sent["compact"]["conv_id"].null_count() == sent["compact"].height
    # The same entries, bound to every conversation that lists the session, in the same
    # order with the same ids; only request_id names the one shared request.
    e_c, e_p = compact.read_table("entries"), plain.read_table("entries")
    assert e_c.height > 0
    assert_frame_equal(e_c.drop("request_id"), e_p.drop("request_id"), check_exact=True)
    assert set(e_c["request_id"]) <= set(sent["compact"]["request_id"])


@pytest.mark.e2e  # e2e: reads the module's two whole scripted runs
def test_same_requests_tables_and_scores(two_runs) -> None:
    compact, plain = (RunDir(r) for r in two_runs)
    req_c, req_p = (r.read_table("requests").filter(pl.col("stage") != "extract")
                    for r in (compact, plain))
    cols = ["stage", "request_id", "conv_id"]
    assert req_c.height == req_p.height > 0
    assert_frame_equal(req_c.select(cols), req_p.select(cols))
    for name in TABLES:
        assert_frame_equal(compact.read_table(name), plain.read_table(name), check_exact=True)
    reports = [json.loads((r.report_dir / "report.json").read_text()) for r in (compact, plain)]
    for key in ("overall", "by_category", "unjudged", "by_judge"):
        assert reports[0][key] == reports[1][key], key
    assert reports[0]["overall"]["n"] == SPEC.questions
    assert len(compact.read_table("judgments")) >= SPEC.questions


def test_extract_once_per_content_variant(tmp_path) -> None:
    """extract.once_per_content=true (opt-in): one request per distinct session content at
    its first occurrence's date; every occurrence gets that reply's entries, dated with its
    own session date. The first occurrences' entries are the default's, request ids included."""
    from tests.fixtures.pipeline import run_pipeline

    spec = SPECS["per_haystack"]
    data = write_longmemeval(spec, tmp_path / "m_slice.json")
    runs = {}
    for flag in ("false", "true"):
        run_dir = tmp_path / f"once-{flag}"
        with hashing_encoder():
            run_pipeline(["debug=scripted", "method=structmem", "benchmark=longmemeval",
                          f"benchmark.path={data}", "stages=[load,extract]",
                          f"extract.once_per_content={flag}",
                          f"paths.cache_dir={tmp_path / 'cache'}"], run_dir)
        runs[flag] = RunDir(run_dir)
    default, variant = runs["false"], runs["true"]
    notes = variant.stage_entry("extract")["notes"]
    sent = {k: r.read_table("requests").filter(pl.col("stage") == "extract").height
            for k, r in runs.items()}
    hay = variant.read_table("turn_haystacks")
    contents, dated = hay["session_key"].n_unique(), hay.select("session_key", "session_hash").n_unique()
    assert contents < dated  # the shape shares contents at other dates
    assert sent["true"] == notes["requests"] < sent["false"]
    assert "once_per_content" in notes["layout"]
    e_d, e_v = default.read_table("entries"), variant.read_table("entries")
    # Each occurrence's entries: the representative's texts, its own session date.
    times = variant.read_table("turns").select("event_id", "session_time")
    dated_right = e_v.join(times, on="event_id").filter(pl.col("event_time") != pl.col("session_time"))
    assert e_v.height > 0 and dated_right.height == 0
    first = hay.unique("session_key", keep="first", maintain_order=True).select("conv_id", "session_index")
    pick = lambda e: e.join(first, on=["conv_id", "session_index"]).sort("entry_id")  # noqa: E731
    assert_frame_equal(pick(e_v), pick(e_d), check_exact=True)
    # Every occurrence of a content holds the same (dia_id, kind, text) rows.
    keyed = e_v.join(hay.select("conv_id", "session_index", "session_key"),
                     on=["conv_id", "session_index"])
    per_occ = keyed.group_by("session_key", "conv_id", "session_index").agg(
        pl.concat_str("dia_id", "kind", "text").sort().alias("rows"))
    assert per_occ.group_by("session_key").agg(pl.col("rows").n_unique())["rows"].max() == 1
