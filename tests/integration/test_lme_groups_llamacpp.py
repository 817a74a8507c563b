"""LongMemEval's scale-out paths on the real stack (llama.cpp + SmolLM2, MiniLM, debug=ci):
`question_groups` (run/groups.py) and the opt-in `extract.once_per_content`.

Uncached LLM budget: the grouped job repeats the session's `longmemeval_example_run` request
for request, so the session cache answers it (0 new requests; a reply that failed to parse is
not cached and is sent again). The once-per-content test extracts a copy of the example in
which question 2's haystack also holds question 1's filler session at another date: the
default sends that occurrence's extraction requests (one window per perspective at debug=ci),
the variant none; stages load and extract only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from structmem_gpu.core.artifacts import RunDir
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

ROOT = Path(__file__).resolve().parents[2]
# Per-question tables, compared sorted (a merge lists them group by group).
COMPARED = {"questions": ["question_id"], "answers": ["question_id"],
            "judgments": ["question_id", "judge_name"],
            "retrievals": ["question_id", "circuit", "rank"]}


def test_grouped_job_equals_the_session_run(longmemeval_example_run: Path,
                                            longmemeval_example_path: Path,
                                            ci_overrides: list[str], tmp_path: Path) -> None:
    """question_groups=1 on the 2-question example: two child jobs/run.py processes attached
    to the session's server, merged; every per-question table, the entries and the scores are
    the whole run's, and nothing reaches the server that the whole run did not already send."""
    grouped = tmp_path / "grouped"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "run.py"), *ci_overrides, "benchmark=longmemeval",
         f"benchmark.path={longmemeval_example_path}", "method=structmem", "question_groups=1",
         f"hydra.run.dir={grouped}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    g, w = RunDir(grouped), RunDir(longmemeval_example_run)
    assert sorted(p.name for p in (grouped / "groups").iterdir() if p.is_dir()) == [
        "g0-of-2", "g1-of-2"]
    for name, keys in COMPARED.items():
        assert_frame_equal(g.read_table(name).sort(keys), w.read_table(name).sort(keys),
                           check_exact=True)
    drop = ["request_id"]  # a shared extraction request is named once per group
    assert_frame_equal(g.read_table("entries").sort("entry_id").drop(drop),
                       w.read_table("entries").sort("entry_id").drop(drop), check_exact=True)
    reports = [json.loads((r.report_dir / "report.json").read_text()) for r in (g, w)]
    for key in ("overall", "by_category", "longmemeval"):
        assert reports[0][key] == reports[1][key], key
    # Served from the session cache: an uncached request is one whose reply did not parse
    # in the whole run either (failed replies are not cached).
    failed = set(w.read_table("requests").filter(~pl.col("parse_ok"))["messages_hash"])
    sent = g.read_table("requests").filter(~pl.col("cache_hit"))
    assert set(sent["messages_hash"]) <= failed, sent.select("stage", "messages_hash")


@pytest.fixture(scope="module")
def shared_content_file(longmemeval_example_path: Path, tmp_path_factory) -> Path:
    """The example with question 1's filler session also first in question 2's haystack, at
    question 2's own date: one content, two dates (LongMemEval's recipe dates per haystack)."""
    items = json.loads(longmemeval_example_path.read_text())
    first, second = items[0], items[1]
    i = next(k for k, sid in enumerate(first["haystack_session_ids"]) if not sid.startswith("answer"))
    second = {**second,
              "haystack_session_ids": [first["haystack_session_ids"][i],
                                       *second["haystack_session_ids"]],
              "haystack_dates": [second["haystack_dates"][0], *second["haystack_dates"]],
              "haystack_sessions": [first["haystack_sessions"][i], *second["haystack_sessions"]]}
    out = tmp_path_factory.mktemp("lme-shared") / "shared_content.json"
    out.write_text(json.dumps([first, second, *items[2:]]))
    return out


def test_once_per_content_extracts_a_shared_session_once(shared_content_file: Path,
                                                         ci_overrides: list[str],
                                                         tmp_path: Path) -> None:
    runs = {}
    for flag in ("false", "true"):
        run_pipeline([*ci_overrides, "benchmark=longmemeval",
                      f"benchmark.path={shared_content_file}", "method=structmem",
                      "stages=[load,extract]", f"extract.once_per_content={flag}"],
                     tmp_path / flag)
        runs[flag] = RunDir(tmp_path / flag)
    default, variant = runs["false"], runs["true"]
    hay = variant.read_table("turn_haystacks")
    assert hay["session_key"].n_unique() < hay.select("session_key", "session_hash").n_unique()
    reqs = {k: r.read_table("requests").filter(pl.col("stage") == "extract")
            for k, r in runs.items()}
    # The variant's requests are the default's first occurrences: a subset, one session fewer.
    assert set(reqs["true"]["messages_hash"]) < set(reqs["false"]["messages_hash"])
    notes = variant.stage_entry("extract")["notes"]
    assert "once_per_content" in notes["layout"] and notes["requests"] == reqs["true"].height
    # Both occurrences of the shared content hold the same entry texts, each with its own
    # session's date.
    e = variant.read_table("entries").join(
        hay.select("conv_id", "session_index", "session_key", "session_time"),
        on=["conv_id", "session_index"])
    assert e.height > 0 and e.filter(pl.col("event_time") != pl.col("session_time")).height == 0
    shared = hay.group_by("session_key").len().filter(pl.col("len") > 1)["session_key"]
    per_occ = (e.filter(pl.col("session_key").is_in(shared.to_list()))
               .group_by("conv_id").agg(pl.concat_str("dia_id", "kind", "text").sort().alias("rows")))
    assert per_occ.height in (0, 2)  # a 135M model may write no entry for the session
    if per_occ.height:
        assert per_occ["rows"][0].to_list() == per_occ["rows"][1].to_list()
    # The default extracted the second occurrence at its own date instead.
    assert default.read_table("entries").join(
        hay.select("conv_id", "session_index", "session_time"), on=["conv_id", "session_index"]
    ).filter(pl.col("event_time") != pl.col("session_time")).height == 0
