"""`jobs/report.py protocols`: one run's answers scored under every published protocol, with
the scripted LLM behind the real response cache (a second call sends nothing)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hydra import compose, initialize_config_dir

from structmem_gpu.core.artifacts import RunDir, atomic_write_parquet
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import run_stages
from tests import official_repos

CONF = Path(__file__).resolve().parents[2] / "conf"
MARK = "Zorblax"  # in no question, gold or conversation of the sample
REASON = f"{MARK} is what the memory says. Answer: "


def _compose(overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Scripted replies behind the real response cache; `calls["n"]` counts replies produced."""
    from structmem_gpu.llm.cache import CachedBackend, ResponseCache

    state: dict[str, Any] = {"n": 0, "table": {}}

    def count(fn: Callable[[LLMRequest], str]) -> Callable[[LLMRequest], str]:
        def wrapped(req: LLMRequest) -> str:
            state["n"] += 1
            return fn(req)
        return wrapped

    @contextlib.contextmanager
    def fake_open(cfg: Any, *, log_dir: Path, cache_dir: Path | None, name: str = "llm"
                  ) -> Iterator[Any]:
        inner = ScriptedLLM({k: count(v) for k, v in state["table"].items()},
                            model_id="scripted-judge")
        assert cache_dir is not None
        cache = ResponseCache(Path(cache_dir))
        try:
            yield CachedBackend(inner, cache)
        finally:
            cache.close()

    monkeypatch.setattr("structmem_gpu.llm.factory.open_llm", fake_open)
    return state


def _answer(req: LLMRequest) -> str:
    question = req.messages[-1].content.rsplit("Question: ", 1)[-1]
    if "Lena adopted" in question or "physiotherapist" in question:
        return "Not mentioned in the conversation"
    return f"{MARK}, in May 2023" if question.startswith("When") else "Sourdough loaves and buns"


def _judge(req: LLMRequest) -> str:
    # CORRECT iff the judged text names MARK: under input=reply every reply does (REASON)
    user = next(m.content for m in req.messages if m.role == "user")
    return json.dumps({"label": "CORRECT" if MARK in user else "WRONG"})


def _build(tmp_path: Path, calls: dict[str, Any], overrides: list[str]) -> tuple[Path, list[str]]:
    calls["table"].update(answer=_answer, judge=_judge)
    run_dir = tmp_path / "run"
    ov = ["debug=scripted", "method=full_context", "report.plots=false",
          f"paths.cache_dir={tmp_path / 'c'}", *overrides]
    cfg = _compose(ov)
    run_stages(cfg, run_dir, stage_registry(cfg))
    # give the replies a reasoning part before the answer line, as the paper reader's have
    run = RunDir(run_dir)
    answers = run.read_table("answers").with_columns(
        (pl.lit(REASON) + pl.col("prediction")).alias("reply"))
    atomic_write_parquet(run.table_path("answers"), answers)
    return run_dir, ov


def _report(argv: list[str]) -> int:
    from jobs.report import main

    return main(argv)


def test_locomo_protocol_rows_scores_and_no_request_on_second_call(
    tmp_path: Path, calls: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, ov = _build(tmp_path, calls, ["benchmark.categories=[1,2,3,4,5]"])
    out = tmp_path / "p"
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    first = json.loads((out / "protocols.json").read_text())
    rows = {r["id"]: r for r in first["protocols"]}
    assert set(rows) == {
        f"judge:ours/{i}/cat5-{c}" for i in ("reply", "answer") for c in ("rule", "judge")
    } | {"f1_locomo", "f1_mem0", "bleu1"}

    q = RunDir(run_dir).read_table("questions")
    a = RunDir(run_dir).read_table("answers")
    pred = dict(a.select("question_id", "prediction").iter_rows())
    cats = dict(q.select("question_id", "category").iter_rows())
    ids = [i for i in q["question_id"].to_list() if i in pred]
    n = len(ids)
    not_mentioned = {i for i in ids if "not mentioned" in pred[i].lower()}
    marked = {i for i in ids if MARK in pred[i]}
    cat5 = {i for i in ids if cats[i] == 5}
    # hand-computed from the scripted judge (CORRECT iff it reads MARK) and LoCoMo's rule
    expect = {
        "judge:ours/reply/cat5-rule": len((set(ids) - cat5) | (cat5 & not_mentioned)) / n,
        "judge:ours/reply/cat5-judge": 1.0,  # every reply names MARK
        "judge:ours/answer/cat5-rule": len((marked - cat5) | (cat5 & not_mentioned)) / n,
        "judge:ours/answer/cat5-judge": len(marked) / n,
    }
    assert 0 < len(marked) < n and cat5 and cat5 - not_mentioned
    for pid, value in expect.items():
        assert rows[pid]["score"] == pytest.approx(value), pid
        lo, hi = rows[pid]["ci95"]
        assert lo <= value <= hi
        assert rows[pid]["n"] == n
    # the lexical rows are the report's (same predictions, same metric code)
    report = json.loads((run_dir / "report" / "report.json").read_text())
    for metric in ("f1_locomo", "f1_mem0", "bleu1"):
        assert rows[metric]["score"] == pytest.approx(report["overall"][metric])
    # the judge stage judged the original replies, equal to the predictions (before REASON was
    # prepended): the answer-input rows reuse its cached replies, the reply-input rows do not
    assert rows["judge:ours/answer/cat5-rule"]["sent"] == 0
    assert rows["judge:ours/reply/cat5-rule"]["sent"] > 0
    assert first["requests_sent"] > 0
    judge_scores = [r["score"] for r in first["protocols"] if r["kind"] == "judge"]
    spread = max(judge_scores) - min(judge_scores)
    assert first["spread"]["judge"]["spread"] == pytest.approx(spread) and spread > 0
    md = (out / "protocols.md").read_text()
    assert "Category numbering" in md and "mem0" in md and "`judge:ours/answer/cat5-judge`" in md

    produced = calls["n"]
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    second = json.loads((out / "protocols.json").read_text())
    assert calls["n"] == produced  # not one reply produced: everything came from the cache
    assert second["requests_sent"] == 0 and all(r["sent"] == 0 for r in second["protocols"])
    assert first["requests_sent_unparsed"] == 0
    assert [r["score"] for r in second["protocols"]] == [r["score"] for r in first["protocols"]]
    assert "judge:ours/answer/cat5-judge" in capsys.readouterr().out


def test_without_category_5_there_are_no_cat5_rows(tmp_path: Path, calls: dict[str, Any]) -> None:
    run_dir, ov = _build(tmp_path, calls, [])
    out = tmp_path / "p"
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    ids = [r["id"] for r in json.loads((out / "protocols.json").read_text())["protocols"]]
    assert ids == ["judge:ours/reply", "judge:ours/answer", "f1_locomo", "f1_mem0", "bleu1"]


def test_official_judge_texts_add_rows_sharing_one_cache_entry(
    tmp_path: Path, calls: dict[str, Any]
) -> None:
    mem0, lightmem = official_repos.spec("mem0"), official_repos.spec("lightmem")
    run_dir, ov = _build(tmp_path, calls, [])
    out = tmp_path / "p"
    ov = [*ov, f"prompts.sources.mem0={mem0}", f"prompts.sources.lightmem={lightmem}"]
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    summary = json.loads((out / "protocols.json").read_text())
    rows = {r["id"]: r for r in summary["protocols"]}
    assert len(rows) >= 6
    assert {"judge:mem0/reply", "judge:lightmem/reply", "judge:ours/reply"} <= set(rows)
    # mem0's and LightMem's texts are character-identical at b3ede5b / 8fc9a91: LightMem's rows
    # are served from the replies mem0's rows fetched
    assert rows["judge:mem0/reply"]["sent"] > 0 and rows["judge:lightmem/reply"]["sent"] == 0
    assert rows["judge:mem0/reply"]["score"] == rows["judge:lightmem/reply"]["score"]
    recs = summary["context"]["official_texts"]
    assert recs["mem0"]["locomo/judge_locomo"]["commit"].startswith("b3ede5b")


def test_an_unparseable_reply_is_the_only_thing_asked_again(
    tmp_path: Path, calls: dict[str, Any]
) -> None:
    run_dir, ov = _build(tmp_path, calls, [])

    def judge(req: LLMRequest) -> str:  # one question's judge reply never parses
        user = next(m.content for m in req.messages if m.role == "user")
        return "CORRECT, I think" if "Priya's stall" in user else _judge(req)

    calls["table"]["judge"] = judge
    out = tmp_path / "p"
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    first = json.loads((out / "protocols.json").read_text())
    # that question under input reply (under input answer, the run's own judge stage had
    # cached a parsed reply before the responder changed)
    assert first["requests_sent_unparsed"] == 1
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    second = json.loads((out / "protocols.json").read_text())
    assert second["requests_sent"] == second["requests_sent_unparsed"] == 1
    rows = {r["id"]: r for r in second["protocols"]}
    assert rows["judge:ours/reply"]["unjudged"] == 1 and rows["judge:ours/reply"]["sent"] == 1


def _lme_run(tmp_path: Path, calls: dict[str, Any], example: Path) -> tuple[Path, list[str]]:
    calls["table"].update(answer=lambda req: "Northwind",
                          judge=lambda req: "yes" if "Northwind" in req.messages[-1].content
                          else "no")
    run_dir = tmp_path / "run"
    ov = ["debug=scripted", "method=full_context", "report.plots=false", "benchmark=longmemeval",
          f"benchmark.path={example}", f"paths.cache_dir={tmp_path / 'c'}"]
    cfg = _compose(ov)
    run_stages(cfg, run_dir, stage_registry(cfg))
    return run_dir, ov


def test_longmemeval_official_per_type_judge_rows(
    tmp_path: Path, calls: dict[str, Any], longmemeval_example_path: Path
) -> None:
    lme = official_repos.spec("longmemeval")
    run_dir, ov = _lme_run(tmp_path, calls, longmemeval_example_path)
    out = tmp_path / "p"
    ov = [*ov, f"prompts.sources.longmemeval={lme}"]
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    summary = json.loads((out / "protocols.json").read_text())
    rows = {r["id"]: r for r in summary["protocols"]}
    assert set(rows) == {f"judge:{t}/{i}" for t in ("longmemeval", "ours")
                         for i in ("reply", "answer")}
    # evaluate_qa.py's templates are new prompts: sent once, then cached
    assert rows["judge:longmemeval/reply"]["sent"] == rows["judge:longmemeval/reply"]["n"] == 2
    assert rows["judge:longmemeval/reply"]["score"] == 1.0  # every reply is "Northwind"
    assert set(summary["context"]["official_texts"]["longmemeval"]) >= {
        "longmemeval/knowledge-update", "longmemeval/abstention"}


def test_longmemeval_rows(tmp_path: Path, calls: dict[str, Any],
                         longmemeval_example_path: Path) -> None:
    run_dir, ov = _lme_run(tmp_path, calls, longmemeval_example_path)
    out = tmp_path / "p"
    assert _report(["protocols", str(run_dir), "--out", str(out), "--override", *ov]) == 0
    rows = {r["id"]: r for r in json.loads((out / "protocols.json").read_text())["protocols"]}
    assert set(rows) == {"judge:ours/reply", "judge:ours/answer"}  # no lexical rows
    assert rows["judge:ours/answer"]["score"] == 1.0


def test_a_run_without_answers_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "empty"
    (run_dir / "tables").mkdir(parents=True)
    rc = _report(["protocols", str(run_dir), "--out", str(tmp_path / "p"),
                  "--override", "debug=scripted"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "answers" in err[0]
    assert not (tmp_path / "p").exists()
