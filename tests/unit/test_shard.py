"""Sharding (structmem_gpu/methods/load.py): deterministic, complete, balanced by the volume of
UNIQUE sessions, and a LongMemEval shard pays once for a session shared by several questions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.load import apply_shard, assign_shards, shard_assignment
from tests.fixtures.pipeline import run_pipeline


def test_shard_assignment_is_deterministic_complete_and_balanced() -> None:
    volumes = {f"c{i}": v for i, v in enumerate([900, 100, 500, 500, 300, 300, 200, 200, 100, 50])}
    a = shard_assignment(volumes, 3)
    assert a == shard_assignment(dict(reversed(list(volumes.items()))), 3)  # input order irrelevant
    assert set(a) == set(volumes) and set(a.values()) == {0, 1, 2}
    loads = [sum(v for c, v in volumes.items() if a[c] == s) for s in range(3)]
    # Greedy LPT: largest first, each to the lightest shard.
    assert max(loads) - min(loads) <= max(volumes.values()) // 2
    # By count the split would be 4/3/3; by volume the 900 conversation sits nearly alone.
    assert sum(1 for c in a if a[c] == a["c0"]) < len(volumes) / 3 + 1


def test_ties_go_to_the_lower_shard_and_conv_id_order() -> None:
    assert shard_assignment({"b": 10, "a": 10, "c": 10}, 3) == {"a": 0, "b": 1, "c": 2}


def test_shared_sessions_are_paid_once_per_shard() -> None:
    # q1 and q2 read the same big session S; q3 and q4 each read their own. Counting S twice
    # would put q1 and q2 on different shards; by unique volume they share one.
    sessions = {
        "q1": {"S": 1000, "a": 10},
        "q2": {"S": 1000, "b": 10},
        "q3": {"T": 900},
        "q4": {"U": 900},
    }
    a = assign_shards(sessions, 2)
    assert a["q1"] == a["q2"]
    loads = [0, 0]
    for s in range(2):
        held = {h: v for q, vols in sessions.items() if a[q] == s for h, v in vols.items()}
        loads[s] = sum(held.values())
    assert sorted(loads) == [1020, 1800]  # {S,a,b} vs {T,U}; the count-blind split is 1910/1810


def test_question_volume_counts_and_empty_shards_are_allowed() -> None:
    a = assign_shards({"x": {}, "y": {}}, 4, own={"x": 5, "y": 7})
    assert a == {"y": 0, "x": 1}


def test_bad_shard_settings_fail_clearly() -> None:
    empty = pl.DataFrame()
    with pytest.raises(ConfigError, match=r"shard_index=4 must be in \[0, num_shards=4\)"):
        apply_shard(empty, empty, 4, 4)
    with pytest.raises(ConfigError, match="num_shards=0"):
        assign_shards({"a": {}}, 0)


def test_sample_shards_partition_the_benchmark(tmp_path: Path) -> None:
    """`stages=[load]` of every shard: disjoint conversations whose union is the whole sample."""
    base = [
        "debug=scripted",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "benchmark=sample",
        "stages=[load]",
    ]
    run_pipeline(base, tmp_path / "all")
    whole = pl.read_parquet(tmp_path / "all/tables/questions.parquet")
    parts = []
    for i in range(3):
        run_pipeline([*base, f"shard_index={i}", "num_shards=3"], tmp_path / f"s{i}")
        parts.append(pl.read_parquet(tmp_path / f"s{i}/tables/questions.parquet"))
    convs = [set(p["conv_id"].to_list()) for p in parts]
    assert sum(len(c) for c in convs) == len(set().union(*convs))  # disjoint
    assert set().union(*convs) == set(whole["conv_id"].to_list())
    assert sorted(pl.concat(parts)["question_id"].to_list()) == sorted(
        whole["question_id"].to_list()
    )
    assert [len(c) for c in convs] == [1, 1, 0]  # two conversations, three shards


# ---- LongMemEval: questions sharing haystack sessions ----------------------------------------
def _session(tag: str, n: int = 3) -> list[dict[str, Any]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{tag} turn {i}: " + "words " * 20,
        }
        for i in range(n)
    ]


def _instance(qid: str, sessions: list[str]) -> dict[str, Any]:
    return {
        "question_id": qid,
        "question_type": "single-session-user",
        "question": f"What about {qid}?",
        "answer": "x",
        "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": sessions,
        "haystack_dates": [f"2023/05/{10 + i:02d} (Wed) 09:00" for i in range(len(sessions))],
        "haystack_sessions": [_session(s) for s in sessions],
        "answer_session_ids": sessions[:1],
    }


def longmemeval_shared(path: Path) -> Path:
    """q1/q2 share sessions s1, s2 (same turns, same dates -> same session_hash); q3, q4 do not."""
    data = [
        _instance("q1", ["s1", "s2", "a1"]),
        _instance("q2", ["s1", "s2", "b1"]),
        _instance("q3", ["c1", "c2"]),
        _instance("q4", ["d1", "d2"]),
    ]
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_longmemeval_questions_sharing_sessions_land_on_one_shard(tmp_path: Path) -> None:
    bench = longmemeval_shared(tmp_path / "lme.json")
    base = [
        "debug=scripted",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "benchmark=longmemeval",
        f"benchmark.path={bench}",
        "stages=[load,extract]",
        "num_shards=2",
    ]
    shard_of = {}
    for i in range(2):
        run_pipeline([*base, f"shard_index={i}"], tmp_path / f"s{i}")
        for q in pl.read_parquet(tmp_path / f"s{i}/tables/questions.parquet")["question_id"]:
            shard_of[q] = i
    assert shard_of["q1"] == shard_of["q2"]
    assert sorted(shard_of) == ["q1", "q2", "q3", "q4"]
    shared = tmp_path / f"s{shard_of['q1']}"
    turns = RunDir(shared).read_table("turns")  # LongMemEval: the compact layout, expanded
    assert turns.filter(pl.col("session_id") == "s1")["session_hash"].n_unique() == 1
    # The shard extracts the shared sessions once: with the compact turns layout each distinct
    # session's windows are requested once (methods/structmem/extract.py, per session), so no
    # request repeats and there are fewer requests than window occurrences over the haystacks.
    req = pl.read_parquet(shared / "tables/requests.parquet").filter(pl.col("stage") == "extract")
    assert req["messages_hash"].n_unique() == req.height  # nothing sent twice
    notes = RunDir(shared).stage_entry("extract")["notes"]
    assert req.height == 2 * notes["windows"] < 2 * notes["window_occurrences"]
