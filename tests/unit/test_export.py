"""`jobs/report.py export`: each format is read and scored by the official code itself, taken
at test time from the bare repositories in STRUCTMEM_OFFICIAL_DIR (tests/official_repos.py):

- mem0 (b3ede5b): evaluation/evals.py `process_item` with metrics/utils.py's
  `calculate_metrics` / `calculate_bleu_scores` (taken with `ast`: the module loads models at
  import), nltk's own `word_tokenize`; F1 and BLEU-1 per answer equal our f1_mem0 / bleu1;
- LightMem (8fc9a91): search_locomo.py main()'s own aggregation statements (taken with `ast`)
  over our sample_*.json files give our judge accuracy, overall and per category;
- LongMemEval (9e0b455): src/evaluation/evaluate_qa.py run as a script on our hypothesis file
  and the benchmark file, its OpenAI client a stand-in that answers each prompt with our
  judge's label for exactly that prompt (an unknown prompt fails the run); then
  print_qa_metrics.py: overall accuracy equals our report's.

The official code runs here, in the test only, as the yardstick; nothing of it is stored.
"""

from __future__ import annotations

import ast
import contextlib
import json
import subprocess
import sys
import typing
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest
from hydra import compose, initialize_config_dir

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.eval.judge import build_request, judge_items, official_judges
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Sampling
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import run_stages
from tests import official_repos
from tests.unit.test_eval_metrics import official_word_tokenize  # noqa: F401 (fixture)

CONF = Path(__file__).resolve().parents[2] / "conf"


def _report(argv: list[str]) -> int:
    from jobs.report import main

    return main(argv)


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Any, judge: Any,
         overrides: list[str]) -> tuple[Path, Any]:
    @contextlib.contextmanager
    def fake_open(cfg: Any, *, log_dir: Path, cache_dir: Path | None, name: str = "llm"
                  ) -> Iterator[ScriptedLLM]:
        yield ScriptedLLM({"answer": answer, "judge": judge}, model_id=f"scripted-{name}")

    monkeypatch.setattr("structmem_gpu.llm.factory.open_llm", fake_open)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "debug=scripted", "method=full_context", "report.plots=false",
            f"paths.cache_dir={tmp_path / 'c'}", *overrides])
    run_dir = tmp_path / "run"
    run_stages(cfg, run_dir, stage_registry(cfg))
    return run_dir, cfg


# varied predictions, so that F1 and BLEU-1 take values other than 0 and 1
_PREDS = ["Biscuit, a beagle.", "On 16 March 2024", "She finished in 1 hour 56 minutes!",
          "Sourdough loaves, cardamom buns and jam", "Not mentioned in the conversation",
          "Mrs. Lindqvist and his brother", "2"]


def _locomo_answer(req: LLMRequest) -> str:
    text = req.messages[-1].content  # differs per question: its question
    return _PREDS[sum(map(ord, text)) % len(_PREDS)]


def _locomo_judge(req: LLMRequest) -> str:
    user = next(m.content for m in req.messages if m.role == "user")
    return json.dumps({"label": "CORRECT" if ("Biscuit" in user or "2024" in user) else "WRONG"})


@pytest.fixture
def locomo_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run_dir, _ = _run(tmp_path, monkeypatch, _locomo_answer, _locomo_judge,
                      ["benchmark.categories=[1,2,3,4,5]"])
    return run_dir


def _ours(run_dir: Path) -> pl.DataFrame:
    j = RunDir(run_dir).read_table("judgments")
    q = RunDir(run_dir).read_table("questions").select("question_id", "category")
    return j.join(q, on="question_id")


def _take(module_text: str, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    tree = ast.parse(module_text)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in keep} == names, f"official module lacks {names}"
    code = compile(ast.Module(body=keep, type_ignores=[]), "<official>", "exec")
    exec(code, namespace)  # noqa: S102 (the official code, run in the test only)
    return namespace


# ---- mem0 -------------------------------------------------------------------------------------
def test_mem0_export_scored_by_mem0s_own_metric_functions(
    locomo_run: Path, tmp_path: Path, official_word_tokenize: Any  # noqa: F811
) -> None:
    import nltk
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    utils = official_repos.show("mem0", "evaluation/metrics/utils.py")
    evals = official_repos.show("mem0", "evaluation/evals.py")
    out = tmp_path / "mem0"
    assert _report(["export", str(locomo_run), "--format", "mem0", "--out", str(out)]) == 0
    data = json.loads((out / "mem0_results.json").read_text())

    ns: dict[str, Any] = {"nltk": nltk, "sentence_bleu": sentence_bleu,
                          "SmoothingFunction": SmoothingFunction, "defaultdict": defaultdict,
                          **{k: getattr(typing, k) for k in ("Dict", "List", "Union")}}
    _take(utils, {"simple_tokenize", "calculate_bleu_scores", "calculate_metrics"}, ns)
    ours = _ours(locomo_run)
    label = {(q, p): bool(lab) for q, p, lab in
             ours.join(RunDir(locomo_run).read_table("questions").select("question_id", "question"),
                       on="question_id").select("question", "prediction", "label").iter_rows()}
    ns["evaluate_llm_judge"] = lambda q, gold, pred: int(label[(q, pred)])  # the LLM part
    _take(evals, {"process_item"}, ns)

    scored = [row for item in data.items() for rows in ns["process_item"](item).values()
              for row in rows]
    by_q = {r["question_id"]: r for rows in data.values() for r in rows}
    assert len(scored) == sum(1 for r in by_q.values() if r["category"] != 5) > 5
    mine = {(q, p): (f1, b) for q, p, f1, b in ours.join(
        RunDir(locomo_run).read_table("questions").select("question_id", "question"),
        on="question_id").select("question", "prediction", "f1_mem0", "bleu1").iter_rows()}
    values = set()
    for row in scored:
        f1, b1 = mine[(row["question"], row["response"])]
        assert row["f1_score"] == pytest.approx(f1, abs=1e-12)
        assert row["bleu_score"] == pytest.approx(b1, abs=1e-12)
        values.add(round(row["f1_score"], 6))
    assert len(values) > 2  # not only 0 and 1
    # mem0's overall means (generate_scores.py: mean over its rows) equal ours on categories 1-4
    cat14 = ours.filter(pl.col("category") != 5)
    assert np.mean([r["f1_score"] for r in scored]) == pytest.approx(cat14["f1_mem0"].mean())
    assert np.mean([r["bleu_score"] for r in scored]) == pytest.approx(cat14["bleu1"].mean())
    assert np.mean([r["llm_score"] for r in scored]) == pytest.approx(
        cat14["label"].fill_null(False).cast(pl.Float64).mean())


# ---- LightMem ---------------------------------------------------------------------------------
def _lightmem_aggregation(text: str) -> tuple[ast.Module, ast.Module]:
    """From search_locomo.py main(): the per-result collection loop (inside the loop over
    samples) with the counters it updates, and the aggregation statements after that loop."""
    main = next(n for n in ast.parse(text).body
                if isinstance(n, ast.FunctionDef) and n.name == "main")
    body = main.body
    names = [next((t.id for t in s.targets if isinstance(t, ast.Name)), None)
             if isinstance(s, ast.Assign) else None for s in body]
    init = [s for s, n in zip(body, names) if n in
            {"all_metrics", "all_categories", "total_questions", "category_counts",
             "total_summaries_used"}]
    sample_loop = next(s for s in body if isinstance(s, ast.For)
                       and isinstance(s.target, ast.Name) and s.target.id == "sample")
    collect = next(s for s in sample_loop.body if isinstance(s, ast.For)
                   and isinstance(s.target, ast.Name) and s.target.id == "qa_result")
    start, stop = names.index("category_scores"), names.index("config_dict")
    per_sample = ast.Module(body=[*init], type_ignores=[])
    loop = ast.For(target=ast.Name("sample_result", ast.Store()),
                   iter=ast.Name("all_results", ast.Load()), body=[collect], orelse=[],
                   lineno=0, col_offset=0)
    first = ast.fix_missing_locations(ast.Module(body=[*per_sample.body, loop], type_ignores=[]))
    second = ast.Module(body=body[start:stop], type_ignores=[])
    return first, second


def test_lightmem_export_aggregated_by_search_locomo_gives_our_judge_accuracy(
    locomo_run: Path, tmp_path: Path
) -> None:
    text = official_repos.show("lightmem", "experiments/locomo/search_locomo.py")
    out = tmp_path / "lightmem"
    assert _report(["export", str(locomo_run), "--format", "lightmem", "--out", str(out)]) == 0
    samples = [json.loads(p.read_text()) for p in sorted(out.glob("sample_*.json"))]
    assert samples and (out / "summary.json").is_file()
    collect, aggregate = _lightmem_aggregation(text)
    ns: dict[str, Any] = {"all_results": samples, "np": np,
                          "args": SimpleNamespace(enable_summary=False)}
    exec(compile(collect, "<search_locomo.py>", "exec"), ns)  # noqa: S102
    exec(compile(aggregate, "<search_locomo.py>", "exec"), ns)  # noqa: S102
    official = ns["aggregate_results"]

    ours = _ours(locomo_run).filter(pl.col("category") != 5)
    acc = ours["label"].fill_null(False).cast(pl.Float64)
    assert official["overall"]["judge_correct"]["mean"] == pytest.approx(acc.mean())
    assert official["overall"]["judge_correct"]["count"] == ours.height == ns["total_questions"]
    for cat, group in ours.group_by("category"):
        got = official[f"category_{cat[0]}"]["judge_correct"]
        assert got["mean"] == pytest.approx(group["label"].fill_null(False).cast(pl.Float64).mean())
        assert got["count"] == group.height
    assert 0 < acc.mean() < 1
    # the summary.json we write says the same as LightMem's own aggregation
    assert _same(json.loads((out / "summary.json").read_text())["aggregate_metrics"], official)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        assert set(a) == set(b)
        return all(_same(a[k], b[k]) for k in a)
    assert a == pytest.approx(b)
    return True


# ---- LongMemEval ------------------------------------------------------------------------------
_STUB_OPENAI = '''
import json, os
class RateLimitError(Exception): pass
class APIError(Exception): pass
organization = None
_REPLIES = json.load(open(os.environ["STUB_JUDGE_REPLIES"]))
class _Completions:
    def create(self, **kw):
        (msg,) = kw["messages"]
        text = _REPLIES[msg["content"]]  # a prompt our judge never sent: KeyError, run fails
        m = type("M", (), {"content": text})
        c = type("C", (), {"message": m})
        return type("R", (), {"choices": [c]})
class OpenAI:
    def __init__(self, **kw):
        self.chat = type("Chat", (), {"completions": _Completions()})
'''
_STUB_BACKOFF = '''
def expo(*a, **k): pass
def on_exception(*a, **k):
    return lambda fn: fn
'''


def test_longmemeval_export_scored_by_evaluate_qa(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, longmemeval_example_path: Path
) -> None:
    lme = official_repos.spec("longmemeval")
    evaluate = official_repos.show("longmemeval", "src/evaluation/evaluate_qa.py")
    metrics = official_repos.show("longmemeval", "src/evaluation/print_qa_metrics.py")

    def answer(req: LLMRequest) -> str:
        return "Northwind" if "Where do I work" in req.messages[-1].content else "Rex is a dog"

    def judge(req: LLMRequest) -> str:  # yes for synthetic_0001 (gold Northwind), no for _abs
        return "yes" if "Northwind" in req.messages[-1].content else "no"

    run_dir, cfg = _run(
        tmp_path, monkeypatch, answer, judge,
        ["benchmark=longmemeval", f"benchmark.path={longmemeval_example_path}",
         f"prompts.sources.longmemeval={lme}"])
    out = tmp_path / "lme"
    assert _report(["export", str(run_dir), "--format", "longmemeval", "--out", str(out)]) == 0
    hyp = out / "longmemeval_hypotheses.jsonl"

    # what our judge stage sent for each question (the official template, filled by us) -> its reply
    run = RunDir(run_dir)
    items = judge_items(run.read_table("questions"), run.read_table("answers"), "reply")
    texts = official_judges(JobConfig.from_cfg(cfg))
    labels = dict(run.read_table("judgments").select("question_id", "label").iter_rows())
    replies = {}
    for it in items:
        req = build_request(it, "x", Sampling(temperature=0.0, max_tokens=10), "paper", texts)
        replies[req.messages[0].content] = "yes" if labels[it.question_id] else "no"
    assert len(set(replies.values())) == 2  # one yes, one no: the accuracy is not trivial

    stubs = tmp_path / "stubs"
    (stubs / "openai").mkdir(parents=True)
    (stubs / "openai" / "__init__.py").write_text(_STUB_OPENAI)
    (stubs / "backoff.py").write_text(_STUB_BACKOFF)
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    (tmp_path / "evaluate_qa.py").write_text(evaluate)
    (tmp_path / "print_qa_metrics.py").write_text(metrics)
    env = {"PYTHONPATH": str(stubs), "STUB_JUDGE_REPLIES": str(tmp_path / "replies.json"),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(tmp_path / "evaluate_qa.py"), "gpt-4o", str(hyp),
                           str(longmemeval_example_path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((run_dir / "report" / "report.json").read_text())["longmemeval"]
    accuracy = next(line for line in done.stdout.splitlines() if line.startswith("Accuracy:"))
    assert float(accuracy.split()[1]) == pytest.approx(report["overall_accuracy"], abs=1e-4)
    results = Path(str(hyp) + ".eval-results-gpt-4o")
    got = {json.loads(x)["question_id"]: json.loads(x)["autoeval_label"]["label"]
           for x in results.read_text().splitlines()}
    assert got == {q: bool(v) for q, v in labels.items()}
    done = subprocess.run([sys.executable, str(tmp_path / "print_qa_metrics.py"), str(results),
                           str(longmemeval_example_path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    overall = next(x for x in done.stdout.splitlines() if x.startswith("Overall Accuracy:"))
    assert float(overall.split()[-1]) == pytest.approx(report["overall_accuracy"], abs=1e-4)


# ---- refusals ---------------------------------------------------------------------------------
def test_wrong_benchmark_for_the_format_is_one_line_exit_2_and_writes_nothing(
    locomo_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x"
    assert _report(["export", str(locomo_run), "--format", "longmemeval", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LongMemEval" in err[0] and not out.exists()
