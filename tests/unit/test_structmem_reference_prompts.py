"""prompts.reference_dir: reference prompt texts read from a LightMem checkout at run time."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.types import LLMResult
from structmem_gpu.methods.structmem.extract import (
    ExtractSettings,
    build_request,
    map_items,
    plan_windows,
)
from structmem_gpu.methods.structmem.prompts import reference
from structmem_gpu.methods.structmem.prompts import synthesis
from tests.unit.test_structmem_extract import turns_frame

CHECKOUT = Path(__file__).parents[1] / "fixtures" / "lightmem_checkout"
S = ExtractSettings(turns_per_request=3, context_turns=2, perspectives=("fact", "relation"), max_tokens=256, max_items=None, max_item_chars=200, temperature=0.1, top_p=0.1, reference_dir=str(CHECKOUT))


def _result(req, data) -> LLMResult:
    return LLMResult(req.request_id, "", data, True, 0, 0, None, 0.0, "stop", False, 1, "m", "x")


def test_extraction_uses_the_checkout_prompt_and_line_format() -> None:
    win = plan_windows(turns_frame(), 3, 2)[1]  # D1:4 (image), D1:5
    req = build_request(win, "fact", S)
    system, user = (m.content for m in req.messages)
    assert system.startswith("FIXTURE factual prompt.")
    assert user.splitlines() == [
        "--- Topic 1 ---",
        "[2023-05-08T13:56:00.000, Mon] 0.Ben: turn D1:4 (image description: a red door)",
        "[2023-05-08T13:56:01.000, Mon] 1.Ana: turn D1:5",
    ]
    assert req.prompt_version.startswith("reference-fact/")
    props = req.schema["properties"]["data"]["items"]["properties"]
    assert props["source_id"]["enum"] == [0, 1] and "fact" in props
    rel = build_request(win, "relation", S)
    assert rel.messages[0].content.startswith("FIXTURE relational")
    assert "relation" in rel.schema["properties"]["data"]["items"]["properties"]


def test_reference_reply_maps_source_ids_back_to_our_turns() -> None:
    win = plan_windows(turns_frame(), 3, 0)[1]
    req = build_request(win, "relation", S)
    data = {
        "data": [
            {"source_id": 1, "relation": "Ana thanked Ben."},
            {"source_id": 0, "relation": "Ben showed Ana a red door."},
            {"source_id": 2, "relation": "out of range"},
        ]
    }
    mapped = map_items(win, "relation", req, _result(req, data))
    assert [(e.dia_id, e.text) for e in mapped.entries] == [
        ("D1:5", "Ana thanked Ben."),
        ("D1:4", "Ben showed Ana a red door."),
    ]
    assert mapped.rejected == 1  # never clamped onto the last turn


def test_reference_synthesis_template_is_filled() -> None:
    t = datetime(2023, 5, 8, 13, 56)
    buf = [synthesis.Record(t, "Ben", "fact", "Ben moved."), synthesis.Record(t, "Ana", "relation", "Ana cheered.")]
    msgs = reference.reference_synthesis_messages(str(CHECKOUT), buf, [])
    user = msgs[-1].content
    assert "People: Ana, Ben" in user and "[2023-05-08T13:56:00.000, Mon] Ben: Ben moved." in user
    assert reference.NO_CONTEXT in user and "{" not in user


def test_missing_file_and_missing_prompt_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="src/lightmem/memory/prompts.py"):
        reference.reference_prompt(str(tmp_path), "fact")
    broken = tmp_path / "co"
    shutil.copytree(CHECKOUT, broken)
    f = broken / reference.PROMPTS_FILE
    f.write_text(f.read_text().replace("LoCoMo_Event_Binding_relational", "Renamed"))
    with pytest.raises(ConfigError, match="LoCoMo_Event_Binding_relational"):
        reference.reference_prompt(str(broken), "relation")
    assert reference.reference_prompt(str(broken), "fact").startswith("FIXTURE")
