"""LightMem's own pipeline (experiment=structmem_locomo_official_code) against our port of it
(experiment=structmem_locomo_reference_code) on the bundled sample, request by request
(structmem_gpu.analysis.differential), every difference named by a listed deviation
(structmem_gpu.analysis.deviations).

Both runs reply with LightMem's scripted replies (systems/lightmem_official.py scripted_reply:
a function of the messages alone), the port through a test backend that sends its extraction,
consolidation and update requests to that same function, and both answer and judge with our
scripted LLM. So, as on a deterministic model with a shared cache, while two requests are equal
their replies are too, and the comparison carries through every stage: a difference in one
stage reaches the next only if it is real. Both compress with the same 12-layer LLMLingua-2
stand-in (tests/fixtures/lingua.py).

What it measured (2 shared cores, ~2.5 min): extraction 4/4, update 134/134, answer 18/18,
judge 18/18 requests byte-identical; consolidation 0/8, each differing only in its entries'
times of day (the listed `entry-times`); the settings that differ are listed (`reply-budgets`,
`strict-schema`, `request-seed`, `model-name`). A new unlisted difference fails
`test_every_difference_is_a_listed_deviation`.

Needs the lightmem_official environment (`python jobs/data.py systems install
lightmem_official`), STRUCTMEM_OFFICIAL_DIR with lightmem.git and the [compress] extra."""

from __future__ import annotations

import json
import re
import string
from typing import Any

import pytest

from structmem_gpu.analysis.deviations import explain
from structmem_gpu.analysis.differential import Differential, differential
from structmem_gpu.llm.backends import registered
from structmem_gpu.llm.backends.spec import Backend, OpenContext
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.systems.lightmem_official import scripted_reply
from structmem_gpu.prompts import official
from tests import official_repos
from tests.fixtures.lingua import build_tiny_lingua
from tests.fixtures.pipeline import run_pipeline
from tests.systems.worker_driver import needs_env, needs_official

pytestmark = [pytest.mark.systems_heavy, needs_env("lightmem_official"),
              needs_official("lightmem.git", "the port reads LightMem's texts")]

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"
RECORD = re.compile(rf"^\[{STAMP}, [A-Z][a-z]{{2}}\] [^:\n]+: ")


def _lightmem_says(req: LLMRequest) -> str:
    body = {"messages": [{"role": m.role, "content": m.content} for m in req.messages]}
    return str(scripted_reply(body)["content"])


class LightMemScripted(Backend):
    """Our scripted LLM, with LightMem's scripted replies for the port's build stages."""

    name = "scripted_lightmem"
    http = False
    harness = True

    def open(self, s: Any, ctx: OpenContext) -> Any:
        from structmem_gpu.llm.scripted import ScriptedLLM

        return ScriptedLLM({stage: _lightmem_says for stage in ("extract", "consolidate", "update")},
                           model_id=ctx.model_id, repair_attempts=s.repair_attempts)


STAGES = ["extract", "consolidate", "update", "answer", "judge"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Differential:
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("pair")
    model = build_tiny_lingua(out / "lingua", layers=12)
    common = ["benchmark=sample", "debug=scripted", "report.plots=false",
              f"paths.cache_dir={out / 'cache'}"]
    with registered(LightMemScripted):
        run_pipeline(["experiment=structmem_locomo_official_code", *common,
                      "stages=[load,system_build,system_search,answer,judge]",
                      f"system.options={{llmlingua_model:'{model}',device:cpu}}"], out / "official")
        run_pipeline(["experiment=structmem_locomo_reference_code", *common,
                      f"compress.model={model}", "llm.backend=scripted_lightmem",
                      "stages=[load,compress,segment,extract,embed,consolidate,update,retrieve,"
                      "answer,judge]"], out / "port")
    return differential(out / "official", out / "port", out / "cache")


def test_every_difference_is_a_listed_deviation(pair: Differential) -> None:
    ex = explain(pair)
    assert ex.method == "lightmem_official"
    assert ex.unexplained == [], "\n".join(ex.unexplained)
    for name in STAGES:  # every stage sent requests in both runs, the same number
        s = pair.stage(name)
        assert s.official > 0 and s.official == s.port, (name, s.official, s.port)
    # what the measurement says (module docstring): only consolidation differs in its messages
    assert [n for n in STAGES if pair.stage(n).share != 1.0] == ["consolidate"]
    assert ex.stage("consolidate").explained["entry-times"] == pair.stage("consolidate").official


def test_extraction_requests_are_identical(pair: Differential) -> None:
    s = pair.stage("extract")
    assert s.official > 0 and s.official == s.port, (s.official, s.port)
    assert s.share == 1.0, s.first.diff if s.first else None


def _messages(r: Any) -> list[dict[str, str]]:
    assert r.canon is not None, r.request_id  # the cache holds what was sent
    return json.loads(r.canon)


def _template_pattern() -> re.Pattern[str]:
    """LightMem's consolidation template as a regex, each field a named group."""
    spec = official_repos.spec("lightmem")
    text = official.lightmem_build(spec, official.SYNTHESIS_NAME, "the synthesis template").text
    parts = []
    for literal, name, _, _ in string.Formatter().parse(text):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(f"(?P<{name}>.*?)")
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def test_consolidation_requests_share_their_fixed_parts(pair: Differential) -> None:
    s = pair.stage("consolidate")
    sent = [r for p in s.pairs for r in (p.official, p.port) if r is not None]
    sent += s.unmatched_official + s.unmatched_port
    assert s.official > 0 and s.port > 0 and len(sent) == s.official + s.port - 2 * s.identical
    pattern = _template_pattern()
    systems = set()
    for r in sent:
        msgs = _messages(r)
        assert [m["role"] for m in msgs] == ["system", "user"], r.request_id
        systems.add(msgs[0]["content"])
        m = pattern.match(msgs[1]["content"])
        assert m is not None, (r.request_id, msgs[1]["content"][:400])
        assert re.fullmatch(rf"{STAMP} - {STAMP}", m["bucket"]), (r.request_id, m["bucket"])
        records = m["aggregated_text"].split("\n")
        assert all(RECORD.match(line) for line in records), (r.request_id, records[:3])
        first, last = (re.match(rf"\[({STAMP})", records[i]) for i in (0, -1))
        assert m["bucket"] == f"{first[1]} - {last[1]}"  # type: ignore[index]
        speakers = sorted({line.split("] ", 1)[1].split(": ", 1)[0] for line in records})
        assert m["speakers"] == ", ".join(speakers), r.request_id
    assert len(systems) == 1, systems  # the official literal, in both runs
    spec = official_repos.spec("lightmem")
    assert systems == {official.lightmem_summary_call(spec)["system"].text}
