"""Issue 44 on the session's llama.cpp server (SmolLM2, debug=ci).

- `jobs/report.py judge-audit` on a slice of 3 questions per set of dial481/locomo-audit's
  answer sets: 12 uncached requests at most (asserted); the second call is served from the
  audit store and sends none.
- The session's LoCoMo run (conv-26, first 2 sessions) answered and judged with `eval.errata`
  and `eval.cat5=forced_choice` on categories 2, 3 and 5 (10 questions: 4 temporal, 1
  open-domain, 5 adversarial; the slice's errata: q1 citation-only, q2 and q5
  score-changing): 10 answers + 5 judgments + 2 re-judged entries (asserted <= 30).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl

import pytest

from tests import official_repos
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(900),
]


def test_judge_audit_on_the_real_judge(ci_overrides: list[str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.report import main

    # Its own cache dir: an audit stored in the session's would change the report fingerprint
    # of the session runs that later tests reuse.
    argv = ["judge-audit", *ci_overrides, f"paths.cache_dir={tmp_path}",
            f"paths.official_dir={tmp_path}",
            f"eval.judge_audit.source={official_repos.spec('locomo_audit')}",
            "eval.judge_audit.per_set=3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    stored = Path(out.split("stored: ")[1].split(" (")[0])
    audit = json.loads((stored / "audit.json").read_text())
    print(f"judge audit: {audit['sent']} requests sent; {audit['false_accept']} "
          f"{audit['false_reject']}")
    assert audit["items"] == 12 and audit["sent"] <= 12
    assert all(s["n"] == 3 and s["ci95"] is not None for s in audit["sets"].values())
    assert all(m.startswith("SmolLM2") or "smollm" in m.lower() for m in audit["judge_models"])
    assert "| v2 | wrong | 3 | false accept |" in out
    assert main(argv) == 0
    assert "reused from the audit store" in capsys.readouterr().out


def test_errata_and_forced_choice_on_a_real_run(structmem_locomo2_run: Path, ci_overrides: list[str],
                                                locomo_path: Path, tmp_path: Path,
                                                llama_server) -> None:
    run_dir = tmp_path / "locomo2"  # a copy: the session run other tests read stays untouched
    shutil.copytree(structmem_locomo2_run, run_dir)
    base = [*ci_overrides, "benchmark=locomo", f"benchmark.path={locomo_path}",
            "benchmark.conversations=[conv-26]", "benchmark.max_sessions=2", "method=structmem",
            "benchmark.categories=[2,3,5]", "eval.cat5=forced_choice",
            f"eval.errata={official_repos.spec('locomo_audit')}"]
    before = llama_server.calls()
    run_pipeline([*base, "stages=[retrieve,answer,judge,report]"], run_dir)
    sent = llama_server.calls() - before
    rep = json.loads((run_dir / "report" / "report.json").read_text())
    print(f"errata + forced choice: {sent} requests sent; cat-5 "
          f"{rep['category_5_forced_choice']}; errata {rep['errata']['by_judge']}")
    assert sent <= 30
    assert rep["category_5_rule"] == "forced_choice" and "5" not in rep["by_category"]
    assert rep["category_5_forced_choice"]["same_as_llm"]["n"] == 5
    judg = pl.read_parquet(run_dir / "tables" / "judgments.parquet")
    assert judg.filter(pl.col("judge_model") == "rule:locomo-cat5-choice").height == 5
    errata = pl.read_parquet(run_dir / "tables" / "errata_judgments.parquet")
    kinds = dict(errata.select("question_id", "kind").iter_rows())
    assert kinds == {"conv-26:q1": "citation", "conv-26:q2": "score", "conv-26:q5": "score"}
    assert errata.filter(pl.col("applied"))["judge_model"].null_count() == 0
    group = rep["errata"]["by_judge"]["same_as_llm"]["groups"]["overall"]
    assert group["n"] == rep["overall"]["n"] == 5  # categories 2 and 3: 4 temporal + 1 open-domain
    assert group["official"] == rep["overall"]["judge_accuracy"]
    assert "## Corrected golds" in (run_dir / "report" / "report.md").read_text()
