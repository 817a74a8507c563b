"""prompts.reference_dir: reference prompt texts read from a LightMem checkout at run time."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
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
    buf = [synthesis.Record(t, "Ben", "fact", "Ben moved."),
           synthesis.Record(t + timedelta(seconds=3), "Ana", "relation", "Ana cheered.")]
    msgs = reference.reference_synthesis_messages(str(CHECKOUT), buf, [])
    # the system message as call_summary_llm writes it (utils.py), never a paraphrase
    assert [m.role for m in msgs] == ["system", "user"] and msgs[0].content == "FIXTURE system line."
    user = msgs[-1].content
    # summarize's time range: the first and last entries' ISO times with ms, " - " between
    assert "Time: 2023-05-08T13:56:00.000 - 2023-05-08T13:56:03.000\n" in user
    assert "People: Ana, Ben" in user and "[2023-05-08T13:56:00.000, Mon] Ben: Ben moved." in user
    assert "[2023-05-08T13:56:03.000, Mon] Ana: Ana cheered." in user  # no kind tag
    # call_summary_llm's text when no related entry was found, read from its code
    assert "Other periods:\nFIXTURE nothing related.\n" in user and "{" not in user
    ctx = [synthesis.Record(t - timedelta(days=1), "Ana", "fact", "Ana packed.")]
    with_ctx = reference.reference_synthesis_messages(str(CHECKOUT), buf, ctx)[-1].content
    assert "Other periods:\n[2023-05-07T13:56:00.000, Sun] Ana: Ana packed.\n" in with_ctx
    # the version follows every text the request sends: template, system line, no-context text
    assert reference.version(str(CHECKOUT), "synthesis").startswith("reference-synthesis/")


def test_missing_file_and_missing_prompt_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="experiments/locomo/prompts.py"):
        reference.reference_prompt(str(tmp_path), "fact")
    broken = tmp_path / "co"
    shutil.copytree(CHECKOUT, broken)
    f = broken / reference.prompt_file("relation")
    f.write_text(f.read_text().replace("LoCoMo_Event_Binding_relational", "Renamed"))
    with pytest.raises(ConfigError, match="LoCoMo_Event_Binding_relational"):
        reference.reference_prompt(str(broken), "relation")
    assert reference.reference_prompt(str(broken), "fact").startswith("FIXTURE")
    with pytest.raises(ConfigError, match="no reference prompt for 'relation' in LightMem's flat"):
        reference.reference_prompt(str(CHECKOUT), "relation", "flat")


def test_each_prompt_comes_from_the_file_the_reference_build_reads() -> None:
    # experiments/locomo/prompts.py (add_locomo.py's import) for extraction, the package's
    # prompts.py for the consolidation template: the package's same-named copies are decoys
    assert reference.prompt_file("fact") == reference.prompt_file("relation") \
        == reference.prompt_file("fact", "flat") == "experiments/locomo/prompts.py"
    assert reference.prompt_file("synthesis") == "src/lightmem/memory/prompts.py"
    texts = {(u, m): reference.reference_prompt(str(CHECKOUT), u, m)
             for u, m in [("fact", "event"), ("relation", "event"), ("fact", "flat"), ("synthesis", "event")]}
    assert not any("DECOY" in v for v in texts.values())
    assert texts[("fact", "flat")].startswith("FIXTURE flat prompt.")
    # flat mode: the fact perspective sends METADATA_GENERATE_PROMPT_locomo, its own version
    win = plan_windows(turns_frame(), 3, 0)[0]
    flat = build_request(win, "fact", S.model_copy(update={"reference_mode": "flat"}))
    event = build_request(win, "fact", S)
    assert flat.messages[0].content.startswith("FIXTURE flat prompt.")
    assert flat.messages[1] == event.messages[1]  # the same line format
    assert flat.prompt_version != event.prompt_version and flat.request_id != event.request_id
    assert flat.prompt_version.startswith("reference-fact/")


def test_flat_mode_needs_the_fact_perspective_only() -> None:
    bad = S.model_copy(update={"reference_mode": "flat"})
    assert any("reference_mode=flat" in m for m in bad.check())
    assert not S.model_copy(update={"reference_mode": "flat", "perspectives": ("fact",)}).check()


def test_a_missing_system_line_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "co"
    shutil.copytree(CHECKOUT, broken)
    f = broken / "src/lightmem/memory/utils.py"
    f.write_text(f.read_text().replace('"role": "system"', '"role": "developer"'))
    buf = [synthesis.Record(datetime(2023, 5, 8), "Ben", "fact", "Ben moved.")]
    with pytest.raises(ConfigError, match=r"call_summary_llm in src/lightmem/memory/utils.py .*"
                                          r"has no literal system"):
        reference.reference_synthesis_messages(str(broken), buf, [])
    f.unlink()
    with pytest.raises(ConfigError, match="utils.py"):
        reference.reference_synthesis_messages(str(broken), buf, [])
