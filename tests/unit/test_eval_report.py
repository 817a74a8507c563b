"""Report pieces: group blocks, LongMemEval metrics, rates, cost, threshold, published figures."""

from __future__ import annotations

import json

import polars as pl
import pytest
from omegaconf import OmegaConf

from structmem_gpu import schemas
from structmem_gpu.errors import StructMemError
from structmem_gpu.eval.published import load_published, matching_rows
from structmem_gpu.eval.report import (
    ReportSettings,
    build_costs,
    check_parse_failures,
    group_summary,
    hypotheses_jsonl,
    longmemeval_summary,
    stage_rates,
)
from structmem_gpu.eval.report_md import render_markdown
from tests.contract import REPORT_GROUP_KEYS


def _rows(
    labels: list[bool | None], cats: list[int], abst: list[bool] | None = None
) -> pl.DataFrame:
    n = len(labels)
    return pl.DataFrame(
        {
            "label": labels,
            "category": cats,
            "is_abstention": abst or [False] * n,
            "f1_locomo": [0.5] * n,
            "f1_mem0": [None] * n,
            "bleu1": [1.0] * n,
            "evidence_recall": [None, *([1.0] * (n - 1))][:n],
        },
        schema={
            "label": pl.Boolean,
            "category": pl.Int32,
            "is_abstention": pl.Boolean,
            "f1_locomo": pl.Float64,
            "f1_mem0": pl.Float64,
            "bleu1": pl.Float64,
            "evidence_recall": pl.Float64,
        },
    )


def test_group_block_counts_only_judged_and_keeps_contract_keys() -> None:
    g = group_summary(
        _rows([True, False, None, True], [1, 1, 1, 1]), "multi-hop", ReportSettings(200, 0, 0.5)
    )
    assert set(g) == REPORT_GROUP_KEYS
    assert g["n"] == 3 and g["judge_accuracy"] == pytest.approx(2 / 3)  # unjudged is not wrong
    assert g["f1_locomo"] == 0.5 and g["f1_mem0"] is None and g["evidence_recall"] == 1.0
    lo, hi = g["judge_accuracy_ci95"]
    assert 0.0 <= lo <= 2 / 3 <= hi <= 1.0
    empty = group_summary(_rows([], []), "x", ReportSettings())
    assert (
        empty["n"] == 0 and empty["judge_accuracy"] is None and empty["judge_accuracy_ci95"] is None
    )


def test_longmemeval_overall_task_averaged_abstention() -> None:
    rows = _rows(
        [True, True, True, False, None, True],
        [101, 101, 101, 105, 105, 106],
        [False, False, True, False, False, True],
    )
    s = longmemeval_summary(rows)
    assert s["overall_accuracy"] == pytest.approx(4 / 5) and s["overall_n"] == 5
    assert (
        s["task_averaged_accuracy"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
        and s["task_averaged_types"] == 3
    )
    assert s["abstention_accuracy"] == 1.0 and s["abstention_n"] == 2


def _requests(stage: str, parse_ok: list[bool], finish: list[str]) -> pl.DataFrame:
    return schemas.frame(
        [
            {
                "request_id": f"{stage}{i}",
                "stage": stage,
                "parse_ok": ok,
                "finish_reason": f,
                "prompt_tokens": 10,
                "completion_tokens": 2,
                "cache_hit": i == 0,
            }
            for i, (ok, f) in enumerate(zip(parse_ok, finish))
        ],
        schemas.REQUESTS,
    )


def test_rates_cost_and_threshold() -> None:
    req = pl.concat(
        [
            _requests("extract", [True, False, True, False], ["stop", "length", "stop", "stop"]),
            _requests("judge", [True, True], ["stop", "stop"]),
        ]
    )
    answers = schemas.frame(
        [
            {
                "question_id": "q",
                "conv_id": "c",
                "prediction": "",
                "request_id": "r",
                "parse_ok": False,
            }
        ],
        schemas.ANSWERS,
    )
    parse, trunc = stage_rates(req, answers)
    assert parse == {"extract": 0.5, "judge": 0.0, "answer": 1.0} and trunc == {
        "extract": 0.25,
        "judge": 0.0,
    }
    # With judgments, the judge rate is the share of LLM-judged rows without a label.
    judg = pl.DataFrame(
        {
            "judge_name": ["a", "a", "a", "b", "b"],
            "judge_model": ["m", "m", "rule:locomo-cat5", "m2", "m2"],
            "label": [True, None, None, None, None],
        }
    )
    parse2, _ = stage_rates(req, answers, judg)
    assert parse2["judge"] == 0.75 and parse2["judge:a"] == 0.5 and parse2["judge:b"] == 1.0
    manifest = {
        "stages": {
            "extract": {
                "build_cost": {
                    "calls": 4,
                    "cache_hits": 1,
                    "prompt_tokens": 40,
                    "completion_tokens": 8,
                    "wall_s": 2.0,
                    "batches": 1,
                }
            }
        }
    }
    cost = build_costs(manifest, req, ["load", "extract", "judge"])
    assert cost["extract"] == {
        "calls": 4,
        "cache_hits": 1,
        "prompt_tokens": 40,
        "completion_tokens": 8,
        "wall_s": 2.0,
    }
    assert (
        cost["judge"]["calls"] == 2 and cost["judge"]["wall_s"] is None
    )  # only in requests.parquet
    assert cost["total"]["calls"] == 6
    check_parse_failures({"extract": 0.5}, 0.5)  # at the limit: fine
    with pytest.raises(StructMemError, match=r"stage 'answer' parse failure rate 100.0% exceeds"):
        check_parse_failures(parse, 0.5)


def test_hypotheses_jsonl_one_line_per_question() -> None:
    q = pl.DataFrame({"question_id": ["a_abs", "b"]})
    answers = pl.DataFrame({"question_id": ["b", "a_abs"], "prediction": ["Northwind", None]})
    lines = [json.loads(x) for x in hypotheses_jsonl(q, answers).splitlines()]
    assert lines == [
        {"question_id": "a_abs", "hypothesis": ""},
        {"question_id": "b", "hypothesis": "Northwind"},
    ]


def _cfg(**kw: object) -> object:
    base = {
        "benchmark": {"name": "locomo", "categories": [1, 2, 3, 4]},
        "method": {"name": "structmem"},
        "consolidate": {"seed_k": 15, "enabled": True},
    }
    c = OmegaConf.create(base)
    for k, v in kw.items():
        OmegaConf.update(c, k, v)
    return c


def test_published_rows_have_sources_and_match_configs() -> None:
    rows = load_published()
    assert all(r.source and r.paper for r in rows)
    ids = {r.id for r in matching_rows(_cfg())}  # type: ignore[arg-type]
    assert ids == {"structmem-table1", "structmem-fig3d-k15"}
    t1 = next(r for r in rows if r.id == "structmem-table1")
    assert (
        t1.overall == {"judge_accuracy": 76.82} and t1.by_category["judge_accuracy"]["2"] == 81.62
    )
    assert {r.id for r in matching_rows(_cfg(**{"consolidate.seed_k": 5}))} == {
        "structmem-fig3d-k5"
    }  # type: ignore[arg-type]
    assert {r.id for r in matching_rows(_cfg(**{"method.name": "structmem_no_cross_event"}))} == {  # type: ignore[arg-type]
        "structmem-table2-no-cross-event"
    }
    assert matching_rows(_cfg(**{"benchmark.name": "sample"})) == []  # type: ignore[arg-type]
    seem = {
        r.id
        for r in matching_rows(_cfg(**{"method.name": "seem", "benchmark.name": "longmemeval"}))
    }  # type: ignore[arg-type]
    assert seem == {"seem-table1-longmemeval-seem", "seem-table7-seem"}
    t6 = next(r for r in rows if r.id == "seem-table6-seem")
    assert t6.extra["correct_by_category"]["5"] == 432


def _report(categories: list[int]) -> dict[str, object]:
    g = {
        "name": "overall",
        "n": 2,
        "judge_accuracy": 0.5,
        "judge_accuracy_ci95": [0.0, 1.0],
        "f1_locomo": 0.1,
        "f1_mem0": 0.2,
        "bleu1": 0.3,
        "evidence_recall": None,
    }
    return {
        "benchmark": "locomo",
        "method": "structmem",
        "questions": 2,
        "categories": categories,
        "category_names": {"1": "multi-hop", "2": "temporal"},
        "judge": "j",
        "judge_models": {"j": ["m"]},
        "overall": g,
        "by_category": {"1": {**g, "name": "multi-hop"}},
        "unjudged": 0,
        "by_judge": {"j": {"overall": g, "unjudged": 0, "judge_models": ["m"]}},
        "parse_failure_rate": {"answer": 0.0},
        "truncation_rate": {},
        "build_cost": {
            "answer": {
                "calls": 2,
                "cache_hits": 0,
                "prompt_tokens": 9,
                "completion_tokens": 3,
                "wall_s": 1.0,
            }
        },
        "evidence_recall_excluded": 2,
        "settings": {"bootstrap_resamples": 10, "bootstrap_seed": 0, "max_parse_failure_rate": 0.5},
    }


def test_markdown_shows_published_figures_side_by_side_with_source() -> None:
    rows = matching_rows(_cfg())  # type: ignore[arg-type]
    md = render_markdown(_report([1, 2, 3, 4]), rows)
    assert (
        "StructMem paper, Table 1" in md and "| overall judge accuracy | 50.0 (n=2) | 76.82 |" in md
    )
    assert "| 1 multi-hop judge accuracy | 50.0 (n=2) | 68.77 |" in md
    assert "Published build cost: 1056 calls" in md
    other = render_markdown(_report([1, 2, 3, 4, 5]), rows)
    assert "n/a (published covers categories [1, 2, 3, 4])" in other
