"""LightMem's own StructMem pipeline (structmem_gpu/systems/workers/lightmem_official_worker.py)
run from its environment against our recording front with scripted replies: add_locomo's
`process_single_sample` builds the pre and post stores and the syntheses through LightMem's
own LLMLingua-2 compression and topic segmentation (a 12-layer random-weight stand-in: its
segmenter reads attention layers 8-11), every call attributed to its step; a search in another
process reads the pre store the search driver's way; a rebuild sends the same bodies; replies
that are not JSON are counted as drops.

Needs the environment (`python jobs/data.py systems install lightmem_official`, with
STRUCTMEM_OFFICIAL_DIR at the official checkouts) and the [compress] extra's packages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.lightmem_official import SPEC, scripted_reply
from tests.fixtures.lingua import build_tiny_lingua
from tests.systems.worker_driver import (
    CONVERSATION,
    UNIT,
    WorkerProcess,
    front,
    hashes,
    needs_env,
    request,
    session,
)

pytestmark = [pytest.mark.systems_heavy, needs_env("lightmem_official")]

CLOCK = "2025-01-01T00:00:00"
S1 = CONVERSATION[:4]
S2 = CONVERSATION[4:]
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _sessions() -> list[dict[str, Any]]:
    out = [session(1, "2023-05-08T13:56:00", S1, prefix="t"),
           session(2, "2023-05-25T10:30:00", S2, prefix="t")]
    for s in out:
        for turn in s["turns"]:
            turn["raw_text"] = turn["text"]
            turn["image_caption"] = None
    last = out[1]["turns"][1]
    last["image_caption"] = "a painting of a sunrise over a lake"
    last["text"] = f"{last['raw_text']} [image: {last['image_caption']}]"
    return out


@pytest.fixture(scope="module")
def lingua(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers")
    return str(build_tiny_lingua(tmp_path_factory.mktemp("lingua"), layers=12))


def _worker(tmp: Path, name: str, lingua: str) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=CLOCK,
                         settings={"top_k": 60, "llmlingua_model": lingua, "device": "cpu"})


def _phases(rows: Any) -> list[str]:
    return [rid.split(":")[2] for rid in rows["request_id"].to_list()]


def test_build_search_in_another_process_and_rebuild(tmp_path: Path, lingua: str) -> None:
    store = tmp_path / "s1"
    with _worker(tmp_path, "1", lingua) as w1:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "8fc9a91"
        with front(SPEC) as f:
            built = w1.ask(request(SPEC, "build", f, store, sessions=_sessions()), timeout=900)
            rows1 = f.take_rows("system_build")
            bodies = [json.loads(b) for b in f.chat_bodies]
            w1.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=_sessions()), timeout=900)
            rows2 = f.take_rows("system_build")

    by_store: dict[str, int] = {}
    for m in built["memories"]:
        by_store[m["metadata"]["store"]] = by_store.get(m["metadata"]["store"], 0) + 1
    assert by_store.get("pre", 0) > 0 and by_store.get("post", 0) > 0, by_store
    assert by_store.get("summary", 0) >= 1, by_store  # enable_summary: the syntheses
    assert built["counts"]["pre_update_count"] == by_store["pre"]
    assert built["dropped"] == 0, built["drops"]
    # event mode: one factual and one relational request for the batch (two system prompts);
    # the scripted replies give one item per turn and perspective
    extraction = [b for b in bodies if any("--- Topic " in m["content"] for m in b["messages"]
                                           if m["role"] == "user")]
    assert len({b["messages"][0]["content"] for b in extraction}) == 2
    assert by_store["pre"] == 2 * (len(S1) + len(S2))
    # every step is named in the URL: extraction, consolidation, update
    phases = set(_phases(rows1))
    assert {"build.extract", "build.consolidate", "build.update"} <= phases, phases
    # add_locomo's own rendering reached the prompts: each session's date (parsed from the
    # LoCoMo text the worker rebuilt, a second per turn), turns numbered across the
    # conversation, the caption appended by the driver (compressed by LLMLingua-2, as all text)
    users = "\n".join(m["content"] for b in bodies for m in b["messages"] if m["role"] == "user")
    assert "[2023-05-08T13:56:00.000, Mon] 0.Caroline: " in users
    line = next(ln for ln in users.splitlines() if "5.Melanie: " in ln)
    assert line.startswith("[2023-05-25T10:30:01.000, Thu] 5.Melanie: ")
    assert "sunrise over a lake" in line  # the caption's words ("over the lake" is the text's)
    assert {b["model"] for b in bodies} == {"gpt-4o-mini"}  # the driver's name, as sent
    # a rebuild into a fresh store sends the same chat bodies (clock frozen, ids seeded)
    assert sorted(hashes(rows1, "lightmem_official")) == sorted(hashes(rows2, "lightmem_official"))

    with _worker(tmp_path, "2", lingua) as w2:
        assert w2.hello()["op"] == "ready"
        with front(SPEC) as f:
            found = w2.ask(request(SPEC, "search", f, store, questions=QUESTIONS, k=60))
            rows = f.take_rows("system_search")
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        entries = [h for h in hits if h["kind"] == "memory"]
        assert 0 < len(entries) <= 60 and all(h["memory_id"].startswith("pre:") for h in entries)
        assert any(h["kind"] == "synthesis" for h in hits)  # the pre store's syntheses
    assert set(_phases(rows)) == {"search.retrieve"}
    assert set(rows["prompt_version"].to_list()) == {"lightmem_official/embeddings"}


def test_replies_that_are_not_json_are_counted(tmp_path: Path, lingua: str) -> None:
    def garbled(body: dict[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if any("--- Topic " in u for u in users):
            return {"content": "Sure! Here are the facts: Caroline went to a group."}
        return reply

    with _worker(tmp_path, "g", lingua) as w, front(garbled) as f:
        assert w.hello(enable_summary=False)["op"] == "ready"
        built = w.ask(request(SPEC, "build", f, tmp_path / "g", sessions=_sessions()),
                      timeout=900)
    assert built["dropped"] >= 2, built  # both perspectives' replies, at least
    assert {d["where"] for d in built["drops"]} == {"parse"}
