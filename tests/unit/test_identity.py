"""One identity (structmem_gpu/config/identity.py): a knob's role decides every key it enters.

- A reply knob (role "reply": llm.request_seed, llm.repair_attempts) reruns the LLM stages of a
  run directory; a run knob (llm.progress) reruns nothing and names no other run directory.
- A knob added to a fixture model enters the stage fingerprint, the run key, the
  response-cache key and the judge identity with no other file touched.
"""

from __future__ import annotations

from pathlib import Path

from structmem_gpu.config import run_key as rk
from tests.fixtures.pipeline import run_pipeline

BASE = ["debug=scripted", "stages=[load,extract]"]


def _ran(overrides: list[str], run_dir: Path) -> dict[str, bool]:
    """stage -> whether it ran (False: skipped as finished)."""
    return {o.name: not o.skipped for o in run_pipeline([*BASE, *overrides], run_dir)}


def test_reply_knobs_rerun_the_llm_stages_and_run_knobs_do_not(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"  # a fixed hydra.run.dir: every command below shares it
    assert _ran([], run_dir) == {"load": True, "extract": True}
    assert _ran([], run_dir) == {"load": False, "extract": False}
    # How the server runs and reports: nothing reruns.
    for knob in ("llm.progress=false", "llm.n_threads=1", "llm.max_retries=1"):
        assert _ran([knob], run_dir) == {"load": False, "extract": False}, knob
    # What changes a reply: the LLM stage reruns (load, which sends nothing, does not).
    assert _ran(["llm.request_seed=false"], run_dir) == {"load": False, "extract": True}
    assert _ran(["llm.repair_attempts=2"], run_dir) == {"load": False, "extract": True}


def test_run_knobs_name_no_run_directory_and_reply_knobs_do() -> None:
    assert rk.run_key(["llm.progress=false", "llm.n_threads=4", "llm.api_key_env=K"]) == ""
    assert rk.run_key(["llm.request_seed=false"]) == "llm.request_seed=false"
    assert rk.run_key(["judge=gpt_4o_endpoint", "judge.llm.progress=false"], "sweep") == (
        "judge=gpt_4o_endpoint")
