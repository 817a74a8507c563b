"""The LongMemEval-shaped generator draws dates per haystack, as LongMemEval's recipe does
(data/custom_history/sample_haystack_and_timestamp.py, read from the official mirror here),
and `lme-count` counts what repeats on a file."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime

from structmem_gpu.bench.lme_count import count_file
from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval
from tests import official_repos

FMT = "%Y/%m/%d (%a) %H:%M"


def _dates_by_session(path):
    seen = defaultdict(set)
    for rec in json.loads(path.read_text()):
        for sid, date in zip(rec["haystack_session_ids"], rec["haystack_dates"]):
            seen[sid].add(date)
    return seen


def test_per_haystack_dates_follow_the_recipe(tmp_path):
    recipe = official_repos.show("longmemeval",
                                 "data/custom_history/sample_haystack_and_timestamp.py")
    # what the generator follows: same-day timestamps on a day of 2023/05/20-30, the
    # haystack's n + 1 sorted, the last one the question date
    assert "random_date(2023, 2023, 5, 5, 20, 30)" in recipe
    assert "get_random_same_day_timestamps(len(haystack)+1" in recipe
    spec = HaystackFileSpec(questions=6, sessions=8, pool=10, turns_per_session=2)
    path = write_longmemeval(spec, tmp_path / "per.json")
    for rec in json.loads(path.read_text()):
        times = [datetime.strptime(d, FMT) for d in rec["haystack_dates"]]
        asked = datetime.strptime(rec["question_date"], FMT)
        assert times == sorted(times) and asked >= times[-1]
        assert {t.date() for t in times} | {asked.date()} == {times[0].date()}
        assert datetime(2023, 5, 20) <= times[0] <= datetime(2023, 5, 31)
    shared = [d for sid, d in _dates_by_session(path).items() if sid.startswith("pool_")]
    assert any(len(d) > 1 for d in shared)  # a shared pool session carries several dates
    assert write_longmemeval(spec, tmp_path / "again.json").read_bytes() == path.read_bytes()


def test_counts_per_haystack_against_fixed(tmp_path):
    per = write_longmemeval(HaystackFileSpec(10, 8, 12, 2), tmp_path / "per.json")
    fixed = write_longmemeval(HaystackFileSpec(10, 8, 12, 2, dates="fixed"), tmp_path / "fx.json")
    a, b = count_file(per), count_file(fixed)
    assert a["occurrences"] == b["occurrences"] == 80 and a["questions"] == 10
    # the same pool draws: the same ids and contents either way (10 evidence sessions + pool)
    assert a["distinct_ids"] == b["distinct_ids"] == a["distinct_contents"] == b["distinct_contents"]
    assert b["distinct_dated"] == b["distinct_contents"] < b["occurrences"]  # fixed: shared
    assert a["distinct_dated"] > b["distinct_dated"]  # per haystack: dates split them
    # by hand: distinct (turns, date) pairs of the fixed file
    seen = set()
    for rec in json.loads(fixed.read_text()):
        for sess, date in zip(rec["haystack_sessions"], rec["haystack_dates"]):
            seen.add((json.dumps(sess), date))
    assert len(seen) == b["distinct_dated"]
