"""What a baseline system's build payload says about a conversation's speakers
(systems/stages.build_payloads): the load stage's `conversations` table carries each
conversation's speaker_a / speaker_b from the loader, so a system's own driver that pairs turns
by role (MemoryOS) gets LoCoMo's roles, not the order in which the speakers first speak."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_speakers
from structmem_gpu.systems.stages import build_payloads
from tests.fixtures.pipeline import run_pipeline


def _record(sample_id: str, first: str) -> dict:
    """An invented LoCoMo record whose speaker_b (Ben) speaks first when `first` is "Ben"."""
    a, b = ("Ana", "Ben")
    order = (b, a) if first == b else (a, b)
    return {"sample_id": sample_id, "qa": [],
            "conversation": {"speaker_a": a, "speaker_b": b,
                             "session_1_date_time": "9:00 am on 3 March, 2023",
                             "session_1": [{"speaker": who, "dia_id": f"D1:{i + 1}",
                                            "text": f"turn {i + 1}"}
                                           for i, who in enumerate([*order, *order])]}}


def _loaded(tmp_path: Path, *overrides: str) -> RunDir:
    run_dir = tmp_path / "run"
    run_pipeline([*overrides, "stages=[load]", f"hydra.run.dir={run_dir}",
                  f"paths.cache_dir={tmp_path / 'cache'}"], run_dir)
    return RunDir(run_dir)


def test_the_payload_carries_speaker_a_even_when_speaker_b_speaks_first(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps([_record("b-first", "Ben"), _record("a-first", "Ana")]))
    run = _loaded(tmp_path, "benchmark=locomo", f"benchmark.path={path}")
    conversations = run.read_table("conversations")
    assert conversations.schema == pl.Schema(schemas.CONVERSATIONS)
    assert conversations.rows() == [("b-first", "Ana", "Ben"), ("a-first", "Ana", "Ben")]
    payloads = build_payloads(run.read_table("turns"), conversations)
    first = payloads["b-first"]
    assert first["speakers"] == ["Ben", "Ana"]  # the order of appearance
    assert (first["speaker_a"], first["speaker_b"]) == ("Ana", "Ben")  # the file's roles
    assert payloads["a-first"]["speaker_a"] == "Ana"
    # a run loaded before the table: no roles, the payload (and each unit's resume key) as before
    assert set(build_payloads(run.read_table("turns"))["b-first"]) == {"speakers", "sessions"}
    # a record naming no roles: none in the payload
    unnamed = conversations.with_columns(pl.lit(None, pl.String).alias("speaker_a"))
    assert "speaker_a" not in build_payloads(run.read_table("turns"), unnamed)["b-first"]


def test_longmemeval_speakers_are_its_roles() -> None:
    frame = load_speakers("longmemeval", None, ["q1", "q2_abs"])
    assert frame.rows() == [("q1", "user", "assistant"), ("q2_abs", "user", "assistant")]


@pytest.mark.locomo
def test_real_locomo_conv_30_payload_carries_its_speaker_a(tmp_path: Path, locomo_path: Path
                                                           ) -> None:
    run = _loaded(tmp_path, "benchmark=locomo", f"benchmark.path={locomo_path}")
    payloads = build_payloads(run.read_table("turns"), run.read_table("conversations"))
    conv = payloads["conv-30"]
    assert conv["speakers"][0] == "Gina"  # she speaks first
    assert (conv["speaker_a"], conv["speaker_b"]) == ("Jon", "Gina")
    b_first = {c for c, p in payloads.items() if p["speakers"][0] != p["speaker_a"]}
    assert b_first == {"conv-30", "conv-41", "conv-42", "conv-43", "conv-47", "conv-49"}
    assert all({p["speaker_a"], p["speaker_b"]} == set(p["speakers"]) for p in payloads.values())
