"""`jobs/report.py judge-audit` against the session's llama.cpp server (SmolLM2, debug=ci) on a
slice of 3 questions per set of dial481/locomo-audit's answer sets: 12 uncached requests at
most (asserted); the second call is served from the audit store and sends none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import official_repos
from tests.fixtures.llm import llamacpp_missing

pytestmark = [
    pytest.mark.integration,
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
