"""answer -> judge -> report through the real pipeline with a scripted LLM (no server).

The scripted backend replaces `open_llm`, so the stages, the request log, the manifest and the
report files are the real ones; only the replies are scripted per stage.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hydra import compose, initialize_config_dir

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.llm.scripted import ScriptedFailure, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import run_stages
from tests.contract import REPORT_GROUP_KEYS

CONF = Path(__file__).resolve().parents[2] / "conf"

def _run(overrides: list[str], run_dir: Path) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["debug=scripted", *overrides])
    run_stages(cfg, run_dir, stage_registry(cfg))


@pytest.fixture
def responders(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[LLMRequest], str]]:
    """Per-stage scripted replies; every backend the job opens (answer model, judges) uses them."""
    table: dict[str, Callable[[LLMRequest], str]] = {}

    @contextlib.contextmanager
    def fake_open(
        cfg: Any, *, log_dir: Path, cache_dir: Path | None, name: str = "llm"
    ) -> Iterator[ScriptedLLM]:
        yield ScriptedLLM(table, model_id=f"scripted-{name}")

    monkeypatch.setattr("structmem_gpu.llm.factory.open_llm", fake_open)
    return table


def _question(req: LLMRequest) -> str:
    return req.messages[1].content.rsplit("Question: ", 1)[-1]


def _answer(req: LLMRequest) -> str:
    q = _question(req)
    if q == "What is the name of the dog Tomas adopted?":
        raise ScriptedFailure("HTTP 400: this one was refused")
    return "Not mentioned in the conversation" if "Lisbon" in q else "Biscuit"


def _judge(req: LLMRequest) -> str:
    # the judged pair: the first user message (paper: the only message; reasoned: after the
    # system message; a repair attempt appends messages after it)
    user = next(m.content for m in req.messages if m.role == "user")
    if "When" in user:
        return '{"reasoning": "cut off mid-sente'  # malformed: unjudged, not wrong
    label = "CORRECT" if "Generated answer: Biscuit" in user else "WRONG"
    return json.dumps({"reasoning": "compared with the gold answer", "label": label})


@pytest.fixture
def sample_run(tmp_path: Path, responders: dict[str, Callable[[LLMRequest], str]]) -> Path:
    responders.update(answer=_answer, judge=_judge)
    run_dir = tmp_path / "run"
    _run(
        [
            "method=full_context",
            "benchmark.categories=[1,2,3,4,5]",
            f"paths.cache_dir={tmp_path / 'c'}",
        ],
        run_dir,
    )
    return run_dir


def test_every_selected_question_answered_and_judged_once(sample_run: Path) -> None:
    run = RunDir(sample_run)
    questions, answers, judg = (run.read_table(t) for t in ("questions", "answers", "judgments"))
    assert sorted(answers["question_id"]) == sorted(
        questions["question_id"]
    )  # all 5 categories selected
    assert judg.group_by("question_id", "judge_name").len()["len"].max() == 1
    assert judg.height == questions.height
    failed = answers.filter(~pl.col("parse_ok"))
    assert failed.height == 1 and failed["prediction"].to_list() == [""]
    rows = judg.join(questions.select("question_id", "category"), on="question_id")
    assert set(rows.filter(pl.col("category") == 5)["judge_model"]) == {"rule:locomo-cat5"}
    assert rows.filter(pl.col("judge_model") == "rule:empty-answer")["label"].to_list() == [False]
    unjudged = rows.filter(pl.col("label").is_null())
    assert unjudged.height > 0 and all(r.startswith('{"reasoning"') for r in unjudged["reply_raw"])
    # Only the LLM-judged questions cost a request (cat 5 and the empty answer are rule-scored).
    req = run.read_table("requests")
    n_rule = rows.filter(pl.col("judge_model").str.starts_with("rule:")).height
    assert req.filter(pl.col("stage") == "judge").height == questions.height - n_rule


def test_report_json_contract_and_n_sums(sample_run: Path) -> None:
    rep = json.loads((sample_run / "report" / "report.json").read_text())
    judg = RunDir(sample_run).read_table("judgments")
    judged = int(judg["label"].is_not_null().sum())
    correct = int(judg["label"].fill_null(False).sum())
    assert set(rep["overall"]) == REPORT_GROUP_KEYS
    assert all(set(g) == REPORT_GROUP_KEYS for g in rep["by_category"].values())
    # n = every scored question; unjudged replies count as wrong in judge_accuracy
    assert rep["overall"]["n"] == judg.height == sum(g["n"] for g in rep["by_category"].values())
    assert rep["unjudged"] == rep["overall"]["unjudged"] == judg.height - judged > 0
    assert rep["overall"]["judge_accuracy"] == pytest.approx(correct / judg.height)
    assert rep["overall"]["judge_accuracy_judged"] == pytest.approx(correct / judged)
    assert sum(g["unjudged"] for g in rep["by_category"].values()) == rep["unjudged"]
    assert rep["protocols"] == {"answer": "paper", "judge": "paper", "judge_input": "reply",
                                "texts": "ours"}
    assert rep["published"] == [] and "scripted" in rep["published_excluded"]
    assert set(rep["by_category"]) == {"1", "2", "3", "4", "5"}
    assert rep["category_names"]["5"] == "adversarial" and rep["judge"] == "same_as_llm"
    assert rep["overall_without_adversarial"]["n"] == judg.height - rep["by_category"]["5"]["n"]
    assert (
        set(rep["parse_failure_rate"]) >= {"answer", "judge"} and "judge" in rep["truncation_rate"]
    )
    assert set(rep["build_cost"]["answer"]) == {
        "calls",
        "cache_hits",
        "prompt_tokens",
        "completion_tokens",
        "wall_s",
    }
    assert rep["judge_models"]["same_as_llm"] == [
        "rule:empty-answer",
        "rule:locomo-cat5",
        "scripted-llm",
    ]
    md = (sample_run / "report" / "report.md").read_text()
    assert "| **overall** |" in md and "## Build cost" in md
    assert "None shown: this is a harness run" in md and "judged only" in md


def test_rejudge_adds_a_judge_and_never_reanswers(
    sample_run: Path, responders: dict[str, Any]
) -> None:
    run = RunDir(sample_run)
    answer_rows = run.read_table("requests").filter(pl.col("stage") == "answer")
    answers = run.read_table("answers")
    responders["answer"] = lambda req: pytest.fail("re-judging must not answer again")
    _run(
        [
            "method=full_context",
            "benchmark.categories=[1,2,3,4,5]",
            "stages=[judge,report]",
            "judge=second_cpu",
            f"paths.cache_dir={sample_run.parent / 'c'}",
        ],
        sample_run,
    )
    judg = run.read_table("judgments")
    assert sorted(set(judg["judge_name"])) == ["same_as_llm", "second_cpu"]
    assert judg.group_by("judge_name").len()["len"].to_list() == [answers.height] * 2
    assert run.read_table("requests").filter(pl.col("stage") == "answer").equals(answer_rows)
    assert run.read_table("answers").equals(answers)
    rep = json.loads((sample_run / "report" / "report.json").read_text())
    assert rep["judge"] == "second_cpu" and set(rep["by_judge"]) == {"same_as_llm", "second_cpu"}


def test_broken_judge_prompt_fails_the_report_after_writing_it(
    tmp_path: Path, responders: dict[str, Any]
) -> None:
    responders.update(answer=lambda req: "Biscuit", judge=lambda req: "I think it is right")
    run_dir = tmp_path / "run"
    with pytest.raises(
        StructMemError, match=r"stage 'judge' parse failure rate 100.0% exceeds report\.max_pars"
    ):
        _run(["method=full_context", f"paths.cache_dir={tmp_path / 'c'}"], run_dir)
    rep = json.loads((run_dir / "report" / "report.json").read_text())
    # every reply unjudged: all count as wrong in the headline, none in the judged-only score
    assert rep["overall"]["n"] == rep["unjudged"] == rep["questions"] > 0
    assert rep["overall"]["judge_accuracy"] == 0.0
    assert rep["overall"]["judge_accuracy_judged"] is None
    assert RunDir(run_dir).stage_entry("report") is None  # not recorded as done: a rerun retries it


def test_longmemeval_report_and_hypotheses(
    tmp_path: Path, responders: dict[str, Any], longmemeval_example_path: Path
) -> None:
    responders.update(
        answer=lambda req: "Northwind",
        judge=lambda req: json.dumps(
            {
                "reasoning": "r",
                "label": "yes"
                if "Northwind" in req.messages[-1].content.split("Response:")[0]
                else "no",
            }
        ),
    )
    run_dir = tmp_path / "run"
    _run(
        [
            "method=full_context",
            "benchmark=longmemeval",
            f"benchmark.path={longmemeval_example_path}",
            f"paths.cache_dir={tmp_path / 'c'}",
        ],
        run_dir,
    )
    rep = json.loads((run_dir / "report" / "report.json").read_text())
    lme = rep["longmemeval"]
    assert {"overall_accuracy", "task_averaged_accuracy", "abstention_accuracy"} <= set(lme)
    assert lme["overall_n"] == rep["overall"]["n"] == rep["questions"]
    assert all(int(c) > 100 for c in rep["by_category"])
    lines = (run_dir / "report" / "longmemeval_hypotheses.jsonl").read_text().splitlines()
    assert len(lines) == rep["questions"] and json.loads(lines[0])["hypothesis"] == "Northwind"
    assert "## LongMemEval" in (run_dir / "report" / "report.md").read_text()


def test_the_report_stage_writes_its_page(sample_run: Path) -> None:
    """report/index.html beside report.md: the same scores, relative links that resolve."""
    rep = json.loads((sample_run / "report" / "report.json").read_text())
    page = (sample_run / "report" / "index.html").read_text(encoding="utf-8")
    acc = f"{100 * rep['overall']['judge_accuracy']:.1f}"
    assert f'<div class="value">{acc}</div>' in page and f"n={rep['overall']['n']}" in page
    assert "<h2>Build cost</h2>" in page and "harness run" in page
    links = re.findall(r'href="([^"]+)"', page)
    assert "../tables/judgments.parquet" in links and "report.json" in links
    assert all((sample_run / "report" / h).exists() for h in links), links
