"""`python jobs/run.py ... stages=[load]`: the job-level contract and bad-input behaviour (the
gate's bad-input refusal: a bad LoCoMo record, an unknown LongMemEval role, a missing file).

Each bad input must end the job with exit code 2 and one message naming the file and the
record, with no traceback and no tables left behind.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir

ROOT = Path(__file__).resolve().parents[2]


def run_job(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "run.py"), *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def good_conversation() -> dict:
    """A tiny LoCoMo-format sample written for this test (invented people and events)."""
    return {
        "sample_id": "t-1",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "9:00 am on 3 March, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a cat named Pixel."},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! Send a photo.",
                 "blip_caption": "a grey cat on a sofa"},
            ],
        },
        "qa": [{"question": "What is Ana's cat called?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4}],
    }


def broken(case: str) -> object:
    conv = good_conversation()
    c = conv["conversation"]
    if case == "missing_keys":
        del conv["conversation"]
    elif case == "bad_date":
        c["session_1_date_time"] = "sometime in spring"
    elif case == "empty_conversation":
        del c["session_1"]
    elif case == "turn_without_text":
        c["session_1"][0] = {"speaker": "Ana", "dia_id": "D1:1"}
    elif case == "duplicate_dia_id":
        c["session_1"][1]["dia_id"] = "D1:1"
    return [conv]


CASES = {
    "missing_keys": "conversation",
    "bad_date": "session_1",
    "empty_conversation": "t-1",
    "turn_without_text": "D1:1",
    "duplicate_dia_id": "D1:1",
}


def assert_clean_failure(proc: subprocess.CompletedProcess[str], run_dir: Path, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in: {proc.stderr[-1500:]}"
    assert not list((run_dir / "tables").glob("*")) if (run_dir / "tables").exists() else True
    assert not (run_dir / "manifest.json").exists()


# The gate refuses one bad LoCoMo record through the job (each case is one jobs/run.py
# process, ~1.3 s); the others, checked in-process by tests/unit/test_data_bad_input.py,
# run through the job in the e2e tier.
GATE_CASE = "bad_date"


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == GATE_CASE else pytest.mark.e2e)
                                  for c in sorted(CASES)])
def test_bad_record_fails_cleanly(tmp_path: Path, case: str) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(broken(case)))
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=locomo", f"benchmark.path={path}", "stages=[load]", f"hydra.run.dir={run_dir}")
    assert_clean_failure(proc, run_dir, path.name, CASES[case])


def test_longmemeval_unknown_role_fails_cleanly(tmp_path: Path) -> None:
    # a turn spoken by neither user nor assistant: exit 2, one line naming file, question, session
    record = {
        "question_id": "q-role", "question_type": "single-session-user",
        "question": "Which city did I move to?", "answer": "Lisbon",
        "question_date": "2024/02/01 (Thu) 10:00",
        "haystack_session_ids": ["s-1"], "haystack_dates": ["2024/01/05 (Fri) 18:30"],
        "haystack_sessions": [[
            {"role": "user", "content": "I moved to Lisbon last week.", "has_answer": True},
            {"role": "system-admin", "content": "Session logged."},
        ]],
        "answer_session_ids": ["s-1"],
    }
    path = tmp_path / "roles.json"
    path.write_text(json.dumps([record]))
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=longmemeval", f"benchmark.path={path}", "stages=[load]",
                   f"hydra.run.dir={run_dir}")
    assert_clean_failure(proc, run_dir, "roles.json [q-role s-1 s-1_2]", "unknown role 'system-admin'")
    errors = [line for line in proc.stderr.splitlines() if "unknown role" in line]
    assert len(errors) == 1, proc.stderr[-1500:]


def test_missing_file_fails_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=locomo", f"benchmark.path={tmp_path / 'nope.json'}", "stages=[load]",
                   f"hydra.run.dir={run_dir}")
    assert_clean_failure(proc, run_dir, "nope.json")


@pytest.mark.e2e  # e2e: the gate keeps three refusals through the job
def test_invalid_json_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"sample_id": "t-1", ')
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=locomo", f"benchmark.path={path}", "stages=[load]", f"hydra.run.dir={run_dir}")
    assert_clean_failure(proc, run_dir, "broken.json")


@pytest.mark.e2e  # e2e: the gate keeps three refusals through the job
def test_load_contract_on_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.json"
    path.write_text(json.dumps([good_conversation(), copy.deepcopy(good_conversation()) | {"sample_id": "t-2"}]))
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=locomo", f"benchmark.path={path}", "stages=[load]", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    turns = pl.read_parquet(run_dir / "tables" / "turns.parquet")
    questions = pl.read_parquet(run_dir / "tables" / "questions.parquet")
    assert turns.height == 4 and questions.height == 2
    assert set(turns["conv_id"]) == {"t-1", "t-2"}
    speakers = pl.read_parquet(run_dir / "tables" / "conversations.parquet")
    assert speakers.rows() == [("t-1", "Ana", "Ben"), ("t-2", "Ana", "Ben")]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["stages"]["load"]["status"] == "done"


@pytest.mark.e2e  # e2e: the gate keeps three refusals through the job
@pytest.mark.locomo
def test_load_real_locomo_via_job(tmp_path: Path, locomo_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_job("benchmark=locomo", f"benchmark.path={locomo_path}", "stages=[load]", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert pl.read_parquet(run_dir / "tables" / "turns.parquet").height == 5882
    assert pl.read_parquet(run_dir / "tables" / "questions.parquet").height == 1986


@pytest.mark.e2e  # e2e: the gate keeps three refusals through the job
def test_load_sample_and_longmemeval_via_job(tmp_path: Path, longmemeval_example_path: Path) -> None:
    for bench, extra in (("sample", []), ("longmemeval", [f"benchmark.path={longmemeval_example_path}"])):
        run_dir = tmp_path / bench
        proc = run_job(f"benchmark={bench}", *extra, "stages=[load]", f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        # Either layout of `turns` (LongMemEval: compact), through the one accessor.
        assert RunDir(run_dir).read_table("turns").height > 0
        assert (run_dir / "tables" / "turns.parquet").exists() == (bench == "sample")
        questions = pl.read_parquet(run_dir / "tables" / "questions.parquet")
        assert questions.height > 0
        # one row of speakers per conversation: the sample's named roles, LongMemEval's roles
        speakers = pl.read_parquet(run_dir / "tables" / "conversations.parquet")
        assert sorted(speakers["conv_id"]) == sorted(questions["conv_id"].unique())
        if bench == "longmemeval":
            assert set(speakers.select("speaker_a", "speaker_b").rows()) == {("user", "assistant")}
        else:
            assert speakers.filter(pl.col("conv_id") == "sample-1").rows() == [
                ("sample-1", "Lena", "Tomas")]
