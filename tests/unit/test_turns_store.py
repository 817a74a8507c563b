"""The compact turns layout (structmem_gpu/core/turns_store.py) and the streaming LongMemEval load.

- The expansion reproduces, row for row, what main's loader (commit 782e59d, before the
  compact layout) wrote as turns.parquet: tests/fixtures/longmemeval_layout/ holds a small
  LongMemEval-format file (longmemeval_synthetic.py's shape plus crafted edge cases: a
  repeated session id, a shared session without its has_answer flags, a shared id with
  another date) and main's output for it, written by running main's code on that file.
- RunDir's one accessor: read_table/has_table/table_sha256 for either layout, stale files of
  the other layout removed on write, intact outputs.
- The load stage keeps the plain turns.parquet for the sample (and LoCoMo) and writes the
  compact layout for LongMemEval; shard assignment is the same in both layouts.
- The streaming JSON reader against json.loads, at buffer sizes that cut every token.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from structmem_gpu.core import schemas, turns_store
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.data.jsonstream import iter_json_list
from structmem_gpu.data.longmemeval import load_longmemeval, load_longmemeval_compact
from structmem_gpu.core.errors import InputError
from structmem_gpu.methods import load as load_stage
from structmem_gpu.core.turns_store import CompactTurns

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "longmemeval_layout"
HAYSTACKS = FIXTURES / "haystacks.json"
MAIN_TURNS = FIXTURES / "main_782e59d_turns.parquet"
MAIN_QUESTIONS = FIXTURES / "main_782e59d_questions.parquet"


def test_expansion_matches_main_loader() -> None:
    turns, questions = load_longmemeval(HAYSTACKS)
    assert_frame_equal(turns, pl.read_parquet(MAIN_TURNS))
    assert_frame_equal(questions, pl.read_parquet(MAIN_QUESTIONS))
    compact, _ = load_longmemeval_compact(HAYSTACKS)
    # Stored once per distinct session: fewer rows than the plain layout, same expansion.
    assert compact.sessions.height < turns.height == compact.turn_count
    assert compact.haystacks.height == turns.select("conv_id", "session_index").unique().height
    # The crafted cases are kept apart: the repeat, the flag-less copy; the same turns at
    # another date are one stored content with two dated occurrences.
    assert turns.filter(pl.col("session_id").str.contains("#repeat2", literal=True)).height == 2
    keys = compact.sessions.group_by("session_id").agg(pl.col("session_key").n_unique())
    per_id = dict(keys.iter_rows())
    assert per_id["answer_syn_m_00000_1"] == 2  # with and without has_answer
    assert per_id["pool_000006"] == 1  # one content ...
    dated = (compact.haystacks.join(compact.sessions.select("session_key", "session_id").unique(),
                                    on="session_key")
             .filter(pl.col("session_id") == "pool_000006"))
    assert dated["session_time"].n_unique() == dated["session_hash"].n_unique() == 2  # ... 2 dates


# Kept question ids as main's loader (782e59d) kept them on the fixture file.
MAIN_KEPT = {(None, 4): ["syn_m_00000", "syn_m_00002", "syn_m_00004"],
             (("syn_m_00003", "syn_m_00002"), 4): ["syn_m_00002"],
             (("syn_m_00003", "syn_m_00001"), None): ["syn_m_00001", "syn_m_00003"]}


@pytest.mark.parametrize(("selection", "max_sessions"), list(MAIN_KEPT))
def test_selection_and_max_sessions_match_main(selection, max_sessions) -> None:
    compact, q = load_longmemeval_compact(HAYSTACKS, selection, max_sessions)
    kept = MAIN_KEPT[(selection, max_sessions)]
    assert q["question_id"].to_list() == kept
    main = pl.read_parquet(MAIN_TURNS).filter(pl.col("conv_id").is_in(kept))
    if max_sessions is not None:
        main = main.filter(pl.col("session_index") <= max_sessions)
    assert_frame_equal(compact.expand(), main)
    assert set(compact.sessions["session_key"]) == set(compact.haystacks["session_key"])


def test_round_trip_any_benchmark(sample_path: Path) -> None:
    turns, _ = load_benchmark("sample", sample_path, None, None)
    compact = CompactTurns.from_turns(turns)
    assert_frame_equal(compact.expand(), turns)
    assert compact.turn_count == turns.height


def test_rundir_accessor_both_layouts(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert not run.has_table("turns") and run.table_sha256("turns") is None
    compact, _ = load_longmemeval_compact(HAYSTACKS)
    run.write_table("turns", compact)
    assert run.has_table("turns") and not run.table_path("turns").exists()
    assert_frame_equal(run.read_table("turns"), compact.expand())
    digest = run.table_sha256("turns")
    info = run.output_info(["turns"])["turns"]
    assert info["rows"] == compact.turn_count and info["sha256"] == digest
    assert run.outputs_intact({"outputs": {"turns": info}})
    # A changed part changes the hash; intact outputs notice.
    smaller = compact.filter_conversations(["syn_m_00001"])
    run.write_table("turns", smaller)
    assert run.table_sha256("turns") != digest
    assert not run.outputs_intact({"outputs": {"turns": info}})
    # Writing the plain layout removes the compact parts (no stale layout to read).
    plain = compact.expand()
    run.write_table("turns", plain)
    assert not any(run.table_path(p).exists() for p in turns_store.PARTS)
    assert_frame_equal(run.read_table("turns"), plain)
    run.write_table("turns", compact)
    assert not run.table_path("turns").exists()
    assert turns_store.turn_conversations(run) == compact.conversations()


def _before_content_keys(compact: CompactTurns) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The two part files as the layout before content keying wrote them: one key per
    (turns, date) occurrence (the dated_key), session_hash/session_time on the turn rows."""
    keys = compact.dated_keys()
    hay = (compact.haystacks.join(keys, on=["session_key", *turns_store.DATED])
           .select("conv_id", "session_index", pl.col("dated_key").alias("session_key")))
    old_cols = [c for c in schemas.TURNS if c not in ("conv_id", "session_index", "event_id")]
    sessions = (compact.dated_sessions(keys).rename({"conv_id": "session_key"})
                .select("session_key", *old_cols))
    return sessions, hay


def test_run_written_before_content_keys_reads_the_same(tmp_path: Path) -> None:
    compact, _ = load_longmemeval_compact(HAYSTACKS)
    sessions, hay = _before_content_keys(compact)
    run = RunDir(tmp_path)
    run.tables_dir.mkdir(parents=True, exist_ok=True)
    for part, frame in zip(turns_store.PARTS, (sessions, hay), strict=True):
        frame.write_parquet(run.table_path(part))
    assert "session_time" in pl.read_parquet(run.table_path("turn_sessions")).columns
    assert_frame_equal(run.read_table("turns"), pl.read_parquet(MAIN_TURNS))
    migrated = turns_store.read_compact(run)
    assert dict(migrated.haystacks.schema) == dict(schemas.TURN_HAYSTACKS)
    assert_frame_equal(migrated.dated_sessions(), compact.dated_sessions())


def test_dated_sessions_one_per_content_and_date() -> None:
    compact, _ = load_longmemeval_compact(HAYSTACKS)
    plain = compact.expand()
    dated = compact.dated_sessions()
    # As many pseudo-sessions as distinct (content, date) pairs, each with its turns once.
    pairs = compact.haystacks.select("session_key", "session_hash").unique()
    assert dated["conv_id"].n_unique() == pairs.height > compact.sessions["session_key"].n_unique()
    assert (dated["session_index"] == 1).all()
    # Each pseudo-session's rows = one occurrence's rows of the plain table, but conv fields.
    body = [c for c in schemas.TURNS if c not in ("conv_id", "session_index", "event_id")]
    first = (compact.haystacks.join(compact.dated_keys(), on=["session_key", *turns_store.DATED])
             .unique("dated_key", keep="first", maintain_order=True))
    where = {k: (c, i) for k, c, i in first.select("dated_key", "conv_id", "session_index")
             .iter_rows()}
    for (name,), rows in dated.group_by("conv_id", maintain_order=True):
        conv, index = where[name]
        one = plain.filter((pl.col("conv_id") == conv) & (pl.col("session_index") == index))
        assert_frame_equal(rows.select(body), one.select(body))
        assert rows["event_id"].to_list() == [f"{name}:{d}" for d in rows["dia_id"]]


def test_load_stage_layouts(tmp_path: Path, compose_config) -> None:
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import run_stages

    sample = compose_config(["debug=scripted", "stages=[load]"])
    run_stages(sample, tmp_path / "sample", stage_registry(sample))
    run = RunDir(tmp_path / "sample")
    assert run.table_path("turns").exists()
    assert not any(run.table_path(p).exists() for p in turns_store.PARTS)
    assert dict(pl.read_parquet(run.table_path("turns")).schema) == dict(schemas.TURNS)

    lme = compose_config(["debug=scripted", "stages=[load]", "benchmark=longmemeval",
                          f"benchmark.path={HAYSTACKS}"])
    run_stages(lme, tmp_path / "lme", stage_registry(lme))
    run = RunDir(tmp_path / "lme")
    assert not run.table_path("turns").exists()
    assert_frame_equal(run.read_table("turns"), pl.read_parquet(MAIN_TURNS))
    notes = run.stage_entry("load")["notes"]
    assert notes["layout"] == "compact" and notes["repeated_sessions"] == 1
    assert notes["turns"] == pl.read_parquet(MAIN_TURNS).height
    # A rerun is skipped: the compact outputs are intact and the fingerprint is stable.
    outcome = run_stages(lme, tmp_path / "lme", stage_registry(lme))
    assert outcome[0].skipped


@pytest.mark.parametrize("num_shards", [2, 3])
def test_shards_same_in_both_layouts(num_shards: int) -> None:
    compact, questions = load_longmemeval_compact(HAYSTACKS)
    plain = compact.expand()
    for shard in range(num_shards):
        t, q = load_stage.apply_shard(plain, questions, shard, num_shards)
        ct, cq = load_stage.apply_shard_compact(compact, questions, shard, num_shards)
        assert_frame_equal(ct.expand(), t)
        assert_frame_equal(cq, q)
        used = set(ct.haystacks["session_key"])
        assert set(ct.sessions["session_key"]) == used  # no session the shard does not use


def _random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([1, -2.5, 1e-7, 'x"\\]', True, False, None, "", 12345678901234567890,
                           "日本語"])
    if r < 0.6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def test_stream_reader_matches_json_loads(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "f.json"
    for _ in range(60):
        data = [_random_value(rng) for _ in range(rng.randint(0, 12))]
        path.write_text(json.dumps(data, indent=rng.choice([None, 1]), ensure_ascii=False),
                        encoding="utf-8")
        for chunk in (1, 2, 3, 7, 1 << 20):  # every token cut somewhere
            assert list(iter_json_list(path, chunk_chars=chunk)) == data


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty file"),
    ('{"a": 1}', "top level must be a JSON list of records, got dict"),
    ("[1,2", "expected ',' or ']' after record 1"),
    ("[1 2]", "expected ',' or ']' after record 0"),
    ('[{"a": }]', "[record 0]: invalid JSON: Expecting value"),
    ("[1] x", "extra data after the list"),
    ('["abc', "[record 0]: invalid JSON: Unterminated string"),
])
def test_stream_reader_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    for chunk in (1, 4, 1 << 20):
        with pytest.raises(InputError, match=None) as err:
            list(iter_json_list(path, chunk_chars=chunk))
        assert message in str(err.value) and str(path) in str(err.value)


def test_merge_compact_shards(tmp_path: Path, compose_config) -> None:
    """Shards of a LongMemEval load merge into the unsharded turns; a session two shards
    share is kept once in the merged turn_sessions."""
    from structmem_gpu.run.merge import read_shards, write_merged
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import run_stages

    base = ["debug=scripted", "stages=[load]", "benchmark=longmemeval",
            f"benchmark.path={HAYSTACKS}", "num_shards=2"]
    dirs = []
    for i in range(2):
        cfg = compose_config([*base, f"shard_index={i}"])
        run_stages(cfg, tmp_path / f"s{i}", stage_registry(cfg))
        dirs.append(tmp_path / f"s{i}")
    parts = [turns_store.read_compact(RunDir(d)) for d in dirs]
    shared = set(parts[0].sessions["session_key"]) & set(parts[1].sessions["session_key"])
    assert shared  # the fixture's pool sessions land in both shards
    write_merged(read_shards(dirs), tmp_path / "merged")
    merged = RunDir(tmp_path / "merged")
    expected = pl.read_parquet(MAIN_TURNS)
    got = merged.read_table("turns").sort("conv_id", "session_index", "turn_index")
    assert_frame_equal(got, expected.sort("conv_id", "session_index", "turn_index"))
    sessions = merged.read_table("turn_sessions")
    assert sessions.select("session_key", "turn_index").is_unique().all()
    assert merged.stage_entry("load")["outputs"]["turns"]["rows"] == expected.height


def test_lme_load_bench_part(tmp_path: Path) -> None:
    """jobs/bench.py lme-load: a child process loads an M-shaped file and reports its peak."""
    from structmem_gpu.bench.lme_load import run_lme_load

    out = run_lme_load(tmp_path / "data", tmp_path / "out", [(3, 6, 12)], turns_per_session=2)
    (point,) = out["points"]
    assert point["questions_loaded"] == 3 and point["turn_rows_plain"] == 3 * 6 * 2
    assert 0 < point["turn_rows_stored"] <= point["turn_rows_plain"]
    assert point["peak_rss_mb"] > 10 and point["load_s"] >= 0
