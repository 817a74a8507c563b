"""`jobs/report.py protocols` on the session's structmem sample run (llama.cpp + SmolLM2,
debug=ci): the run's answers (sample-1's 9 of categories 1-4) scored under mem0's and LightMem's judge text
and our paraphrase, on the reply and on the extracted answer, plus the three lexical metrics.

Uncached LLM budget: mem0's and LightMem's judge texts are character-identical, so they share
their replies; our paraphrase on the reply is the run's own judge stage (cached); a reply equal
to its prediction shares the answer-input request. At most 3 per answer (asserted);
the second call sends none (a reply that did not parse is never cached and would be asked
again: counted apart, and none is expected under llama.cpp's JSON grammar).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import official_repos
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import SAMPLE_RUN

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]


def test_protocols_on_the_sample_run_second_call_sends_nothing(
    structmem_sample_run: Path, ci_overrides: list[str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from jobs.report import main

    argv = ["protocols", str(structmem_sample_run), "--out", str(tmp_path), "--override",
            *ci_overrides, *SAMPLE_RUN,
            f"prompts.sources.mem0={official_repos.spec('mem0')}",
            f"prompts.sources.lightmem={official_repos.spec('lightmem')}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    first = json.loads((tmp_path / "protocols.json").read_text())
    rows = first["protocols"]
    assert len(rows) >= 6 and sum(f"| `{r['id']}` |" in printed for r in rows) >= 6
    assert {r["id"] for r in rows} >= {"judge:mem0/reply", "judge:mem0/answer",
                                       "judge:ours/reply", "judge:ours/answer",
                                       "f1_locomo", "f1_mem0", "bleu1"}
    assert all(r["n"] == rows[0]["n"] > 0 and r["ci95"] is not None for r in rows)
    print(f"protocols: {first['requests_sent']} requests sent on the first call")
    assert first["requests_sent"] <= 3 * rows[0]["n"]

    assert main(argv) == 0
    second = json.loads((tmp_path / "protocols.json").read_text())
    print(f"protocols: second call sent {second['requests_sent']} "
          f"({second['requests_sent_unparsed']} unparseable replies re-asked)")
    # nothing that parsed is sent again; the cache keeps no unparseable reply (SmolLM2 under
    # llama.cpp's JSON grammar produces none at 40 tokens: then this is 0 == 0)
    assert second["requests_sent"] == second["requests_sent_unparsed"]
    assert second["requests_sent"] <= first["requests_sent_unparsed"]
    assert [r["score"] for r in second["protocols"]] == [r["score"] for r in rows]
