"""The LightMem worker's conversation in LoCoMo's own JSON shape (what add_locomo.py's
extract_locomo_sessions and parse_locomo_timestamp read), built from a protocol request; and
the sub-phase routing of its calls. The worker module is standard library only at import."""

from __future__ import annotations

import importlib.util
import sys
from datetime import datetime
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parents[2] / "structmem_gpu" / "systems" / "workers"


@pytest.fixture(scope="module")
def worker():
    sys.path.insert(0, str(WORKERS))
    try:
        spec = importlib.util.spec_from_file_location("lightmem_official_worker",
                                                      WORKERS / "lightmem_official_worker.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(WORKERS))


def test_sample_is_locomo_shaped(worker) -> None:
    req = {"unit": "conv-9", "speakers": ["Ann", "Bo"], "sessions": [
        {"session_index": 2, "session_time": "2023-05-25T22:05:00", "turns": [
            {"event_id": "conv-9:D2:1", "speaker": "Bo", "text": "look [image: a dog]",
             "raw_text": "look", "image_caption": "a dog"}]},
        {"session_index": 1, "session_time": "2023-05-08T13:56:00", "turns": [
            {"event_id": "conv-9:D1:1", "speaker": "Ann", "text": "hi", "raw_text": "hi",
             "image_caption": None}]}]}
    sample = worker._sample(req)
    conv = sample["conversation"]
    assert sample["sample_id"] == "conv-9"
    assert (conv["speaker_a"], conv["speaker_b"]) == ("Ann", "Bo")
    assert conv["session_1"] == [{"speaker": "Ann", "dia_id": "conv-9:D1:1", "text": "hi"}]
    assert conv["session_2"][0]["text"] == "look" and conv["session_2"][0]["blip_caption"] == "a dog"
    # LoCoMo's own date text, which add_locomo parses with this format
    assert conv["session_2_date_time"] == "10:05 pm on 25 May, 2023"
    parsed = datetime.strptime(conv["session_1_date_time"], "%I:%M %p on %d %B, %Y")
    assert parsed == datetime(2023, 5, 8, 13, 56)


def test_sample_keeps_the_requests_speaker_a(worker) -> None:
    """LoCoMo's roles when the request names them (conv-30: Gina speaks before speaker_a Jon;
    add_locomo tags each message speaker_a / speaker_b by them), else the order of appearance."""
    turns = [{"event_id": f"conv-30:D1:{i}", "speaker": who, "text": "hi", "raw_text": "hi",
              "image_caption": None} for i, who in enumerate(("Gina", "Jon"), 1)]
    req = {"unit": "conv-30", "speakers": ["Gina", "Jon"],
           "sessions": [{"session_index": 1, "session_time": "2023-01-20T16:04:00",
                         "turns": turns}]}
    conv = worker._sample({**req, "speaker_a": "Jon", "speaker_b": "Gina"})["conversation"]
    assert (conv["speaker_a"], conv["speaker_b"]) == ("Jon", "Gina")
    conv = worker._sample(req)["conversation"]
    assert (conv["speaker_a"], conv["speaker_b"]) == ("Gina", "Jon")


def test_steps_are_named_in_the_url_path(worker) -> None:
    import worker_common as wc

    phases = wc.SubPhases()
    phases.unit("http://127.0.0.1:9/u/lightmem_official/build/conv%2F9/v1")
    base = "/u/lightmem_official/build/conv%2F9/v1"
    assert phases.route(base + "/chat/completions") == base + "/chat/completions"  # no step
    with phases.step("extract"):
        assert phases.route(base + "/chat/completions") == \
            "/u/lightmem_official/build.extract/conv%2F9/v1/chat/completions"
        assert phases.route("/other/v1/embeddings") == "/other/v1/embeddings"
    phases.unit(None)
    with phases.step("extract"):
        assert phases.route(base + "/embeddings") == base + "/embeddings"
