"""answer / judge / report on the real stack (llama.cpp + SmolLM2, debug=ci).

Reads the session runs of tests/fixtures/pipeline.py (`structmem_sample_run`: the full
structmem pipeline on the bundled sample; `longmemeval_example_run`: the same on the synthetic
LongMemEval example). Asserts structure and counts, never the quality of a 135M model's answers.
Uncached LLM budget: the re-judge test reuses the answer model under another judge name with
the same prompt, so its judge requests are served from the session cache (zero new requests
when the first judge's replies were valid; only failed replies, which are not cached, resend).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.eval.selection import selected_questions
from tests.contract import REPORT_GROUP_KEYS
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import SAMPLE_RUN, compose_cfg, run_pipeline

pytestmark = [
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "report.json").read_text())


def test_one_answer_and_one_judgment_per_question(
    structmem_sample_run: Path, ci_overrides: list[str]
) -> None:
    run = RunDir(structmem_sample_run)
    cfg = compose_cfg([*ci_overrides, *SAMPLE_RUN])
    questions = selected_questions(JobConfig.from_cfg(cfg), run.read_table("questions"))
    assert set(questions["category"].to_list()) <= {1, 2, 3, 4} and questions.height > 0
    answers, judg = run.read_table("answers"), run.read_table("judgments")
    assert sorted(answers["question_id"]) == sorted(questions["question_id"])
    assert answers["question_id"].n_unique() == answers.height
    assert sorted(judg["question_id"]) == sorted(
        questions["question_id"]
    )  # one judge: one row each
    assert judg["judge_name"].unique().to_list() == ["same_as_llm"]
    # Every non-empty answer was judged by the LLM (a request per row); empty ones by rule.
    llm_judged = judg.filter(~pl.col("judge_model").str.starts_with("rule:"))
    judge_req = run.read_table("requests").filter(pl.col("stage") == "judge")
    assert judge_req.height == llm_judged.height
    assert judg["f1_locomo"].null_count() == 0 and judg["bleu1"].null_count() == 0
    assert judg["evidence_recall"].drop_nulls().is_between(0.0, 1.0).all()


def test_report_overall_and_categories(structmem_sample_run: Path) -> None:
    rep = _report(structmem_sample_run)
    judg = RunDir(structmem_sample_run).read_table("judgments")
    judged = int(judg["label"].is_not_null().sum())
    correct = int(judg["label"].fill_null(False).sum())
    assert set(rep["overall"]) == REPORT_GROUP_KEYS
    # n = every scored question; an unjudged reply counts as wrong in judge_accuracy
    assert rep["overall"]["n"] == judg.height == sum(g["n"] for g in rep["by_category"].values())
    assert rep["unjudged"] == rep["overall"]["unjudged"] == judg.height - judged
    assert rep["overall"]["judge_accuracy"] == pytest.approx(correct / judg.height)
    if judged:
        assert rep["overall"]["judge_accuracy_judged"] == pytest.approx(correct / judged)
    assert all(set(g) == REPORT_GROUP_KEYS for g in rep["by_category"].values())
    assert rep["protocols"] == {"answer": "paper", "judge": "paper", "judge_input": "reply",
                                "texts": "ours"}
    assert rep["published"] == [] and rep["published_excluded"]  # debug=ci: never comparable
    assert set(rep["by_category"]) <= {"1", "2", "3", "4"}
    assert {"extract", "consolidate", "answer", "judge"} <= set(rep["build_cost"])
    assert {"extract", "answer", "judge"} <= set(rep["parse_failure_rate"])
    # the CPU profile is structure-only (llm.structure_only): report.md and the closing table
    # `make quickstart` prints open by saying so
    from structmem_gpu.eval.report_md import STRUCTURE_ONLY_LINE, closing_table

    assert rep["structure_only"] is True
    md = (structmem_sample_run / "report" / "report.md").read_text().splitlines()
    assert md[0] == STRUCTURE_ONLY_LINE and md[2] == "# Report: sample / structmem"
    closing = closing_table(structmem_sample_run / "report" / "report.json") or ""
    assert closing.splitlines()[0] == STRUCTURE_ONLY_LINE


@pytest.mark.e2e  # a run or judge of its own beyond the session sample run
def test_longmemeval_report_and_hypotheses(longmemeval_example_run: Path) -> None:
    rep = _report(longmemeval_example_run)
    lme = rep["longmemeval"]
    assert {
        "overall_accuracy",
        "task_averaged_accuracy",
        "abstention_accuracy",
        "abstention_n",
    } <= set(lme)
    assert lme["overall_n"] == rep["overall"]["n"]
    assert all(int(c) > 100 for c in rep["by_category"])  # LongMemEval type ids
    lines = (
        (longmemeval_example_run / "report" / "longmemeval_hypotheses.jsonl")
        .read_text()
        .splitlines()
    )
    rows = [json.loads(x) for x in lines]
    assert len(rows) == rep["questions"] and all(
        set(r) == {"question_id", "hypothesis"} for r in rows
    )


@pytest.mark.e2e  # a run or judge of its own beyond the session sample run
def test_rejudge_copy_adds_judge_without_answering(
    structmem_sample_run: Path, ci_overrides: list[str], tmp_path: Path
) -> None:
    copy = tmp_path / "run-copy"
    shutil.copytree(structmem_sample_run, copy)
    run = RunDir(copy)
    answer_rows = run.read_table("requests").filter(pl.col("stage") == "answer")
    answers = run.read_table("answers")
    run_pipeline(
        [
            *ci_overrides,
            *SAMPLE_RUN,
            "stages=[judge,report]",
            "judge=second_cpu",
        ],
        copy,
    )
    judg = run.read_table("judgments")
    assert sorted(judg["judge_name"].unique().to_list()) == ["same_as_llm", "second_cpu"]
    per_judge = judg.group_by("judge_name").agg(
        pl.col("question_id").n_unique().alias("q"), pl.len().alias("rows")
    )
    assert per_judge["q"].to_list() == per_judge["rows"].to_list() == [answers.height] * 2
    assert run.read_table("requests").filter(pl.col("stage") == "answer").equals(answer_rows)
    assert run.read_table("answers").equals(answers)
    assert set(_report(copy)["by_judge"]) == {"same_as_llm", "second_cpu"}


@pytest.mark.e2e  # a run or judge of its own beyond the session sample run
def test_endpoint_judge_preset_in_json_mode_on_the_real_server(
    structmem_sample_run: Path, ci_overrides: list[str], llama_server, tmp_path: Path
) -> None:
    """judge=gpt_4o_mini_endpoint pointed at the session's llama.cpp server: its requests go
    out in JSON mode (llm.api_flavor=json_mode: json_object without a schema), every selected
    question gets one judgment under the preset's name (a reply without a readable label is
    recorded, not raised), and they are keyed apart from the schema-held judge's replies."""
    copy = tmp_path / "run-copy"
    shutil.copytree(structmem_sample_run, copy)
    run = RunDir(copy)
    answers = run.read_table("answers")
    run_pipeline([*ci_overrides, *SAMPLE_RUN, "stages=[judge,report]",
                  "judge=gpt_4o_mini_endpoint", f"judge.llm.base_url={llama_server.base_url}",
                  "judge.llm.served_name=smollm2", "judge.llm.max_in_flight=2",
                  # SmolLM2-135M unconstrained writes some JSON but rarely a label (measured:
                  # 8 of 9 unreadable); this test is about the path, not the labels
                  "report.max_parse_failure_rate=1.0"], copy)
    judg = run.read_table("judgments").filter(pl.col("judge_name") == "gpt_4o_mini_endpoint")
    assert judg["question_id"].n_unique() == judg.height == answers.height
    sent = run.read_table("requests").filter(pl.col("stage") == "judge")
    new = sent.filter(pl.col("model").str.contains("gpt-4o-mini"))
    # an empty answer is judged by rule, without a request
    assert 0 < new.height <= answers.height
    assert not new["cache_hit"].any()  # its own model id and flavor: nothing from the cache
    assert "gpt_4o_mini_endpoint" in _report(copy)["by_judge"]
