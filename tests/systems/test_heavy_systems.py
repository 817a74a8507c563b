"""The heavy tier of the baseline systems (marker `systems_heavy`, not in CI): the systems too
slow or large for CI's budget (HippoRAG 2's 1.5 GB environment, A-MEM's repository code) run
the CI tier's checks: build -> search -> answer -> judge -> report with their scripted replies,
a rerun with 0 uncached requests, garbled replies counted; and each of them, with the CI
tier's tool-calling systems, against llama.cpp (SmolLM2). Run by hand:

    make systems CI_SYSTEMS=heavy
    python -m pytest -m systems_heavy tests/systems

The last run is recorded in docs/performance.md "Baseline systems".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from structmem_gpu.systems.registry import system_names
from tests.fixtures.lingua import build_tiny_lingua
from tests.systems.test_system_runs import garbled_run, run_and_rerun
from tests.systems.test_systems_llamacpp import LLAMACPP_SYSTEMS, run_on_llamacpp

pytestmark = [pytest.mark.systems_heavy, pytest.mark.timeout(3600)]

HEAVY_SYSTEMS = system_names("heavy")


def _extra(name: str, tmp_path: Path) -> list[str]:
    """What a system needs beyond the sample job: LightMem's own code loads an LLMLingua-2
    model (a 12-layer random-weight stand-in: its segmenter reads layers 8-11)."""
    if name == "lightmem_official":
        model = build_tiny_lingua(tmp_path / "lingua", layers=12)
        return [f"system.options={{llmlingua_model:'{model}',device:cpu}}"]
    return []


@pytest.mark.parametrize("name", HEAVY_SYSTEMS)
def test_a_heavy_system_runs_then_reruns_from_the_cache(name: str, tmp_path: Path) -> None:
    run_and_rerun(name, tmp_path, _extra(name, tmp_path))


# Against llama.cpp (SmolLM2): the heavy systems, and the CI tier's systems whose requests
# llama.cpp cannot honour as the system means them (tool calls, reranker logprobs).
LLAMACPP_HEAVY = [*(n for n in system_names("ci") if n not in LLAMACPP_SYSTEMS), *HEAVY_SYSTEMS]


@pytest.mark.parametrize("name", LLAMACPP_HEAVY)
def test_a_system_on_llamacpp(name: str, llama_server, tmp_path: Path) -> None:
    run_on_llamacpp(name, llama_server, tmp_path, _extra(name, tmp_path))


@pytest.mark.parametrize("name", HEAVY_SYSTEMS)
def test_a_heavy_system_counts_garbled_replies(name: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    garbled_run(name, tmp_path, monkeypatch, _extra(name, tmp_path))
