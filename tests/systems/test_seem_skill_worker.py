"""SEEM's released code (structmem_gpu/systems/workers/seem_skill_worker.py) run from its own
environment against our recording front with its scripted replies: a build stores every turn
(frame extraction, fact triples, fusion batched every 3 observations, flush at the end), each
step named in the URL; a rebuild, in the same worker and in another one, sends the same chat
bodies and ends with the same memories (ids included); a search in another process loads the
store the way the skill's CLI does; replies the skill cannot use are counted as drops (printed
and silent ones) while the conversation completes; a failed call to the front fails the unit.

Needs the environment (`python jobs/data.py systems install seem_skill`, with
STRUCTMEM_OFFICIAL_DIR at the official checkouts holding seem-skill.git)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.seem_skill import SPEC, scripted_reply
from tests.systems.worker_driver import (
    CONVERSATION,
    UNIT,
    Reply,
    WorkerProcess,
    front,
    hashes,
    needs_env,
    request,
    session,
)

needs_seem = needs_env("seem_skill")
pytestmark = [pytest.mark.systems]

CLOCK = "2025-01-01T00:00:00"
S1 = CONVERSATION[:4]
S2 = [
    *CONVERSATION[4:],
    ("Caroline", "Boston has great agencies, I will visit them in June."),
]
TURNS = len(S1) + len(S2)
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _sessions() -> list[dict[str, Any]]:
    out = [session(1, "2023-05-08T13:56:00", S1, prefix="t"),
           session(2, "2023-05-25T10:30:00", S2, prefix="t")]
    for s in out:
        for turn in s["turns"]:
            turn["raw_text"], turn["image_caption"] = turn["text"], None
    last = out[1]["turns"][1]
    last["image_caption"] = "a painting of a sunrise over a lake"
    last["text"] = f"{last['raw_text']} [image: {last['image_caption']}]"
    return out


def _worker(tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=CLOCK, settings={"top_k": 3})


def _phases(rows: Any) -> set[str]:
    return {rid.split(":")[2] for rid in rows["request_id"].to_list()}


def _build_once(tmp: Path, name: str, reply: Reply, **settings: Any) -> dict[str, Any]:
    with _worker(tmp, name) as worker:
        assert worker.hello(**settings)["op"] == "ready"
        with front(reply) as f:
            return worker.ask(request(SPEC, "build", f, tmp / f"store_{name}",
                                      sessions=_sessions()))


@needs_seem
def test_build_search_in_another_process_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "s1"
    with _worker(tmp_path, "1") as w1:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "71dc719"
        # the released code's two defaults (docs/methods.md "seem_skill vs our seem")
        assert ready["defaults"] == {
            "class": {"retrieve_strategy": "hybrid_rrf", "integration_window": 3},
            "config_file": {"retrieve_strategy": "ppr", "integration_window": 5}}
        with front(SPEC) as f:
            built = w1.ask(request(SPEC, "build", f, store, sessions=_sessions()))
            rows1 = f.take_rows("system_build")
            rebuilt = w1.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=_sessions()))
            rows2 = f.take_rows("system_build")

    assert built["dropped"] == 0, built["drops"]
    mems = built["memories"]
    kinds = [m["metadata"]["kind"] for m in mems]
    # windows of 3 observations (+ the flush): the scripted judge merges the first two pending
    # frames of each full window, so 7 turns leave 5 episodic memories
    assert kinds.count("episodic") == TURNS - 2 and kinds.count("chunk") == TURNS
    assert kinds.count("fact") > 0 and built["counts"]["stats"]["integration_count"] == 2
    frames = [m for m in mems if m["metadata"]["kind"] == "episodic"]
    assert all(m["text"].startswith("Summary: ") and m["kind"] == "memory" for m in frames)
    assert len({m["memory_id"] for m in frames}) == len(frames)  # distinct ids (frozen clock)
    merged = [m for m in frames if len(m["metadata"]["chunk_ids"]) == 2]
    assert [m["metadata"]["chunk_ids"] for m in merged] == [["t:D1:1", "t:D1:2"],
                                                              ["t:D1:4", "t:D2:1"]]
    chunks = {m["memory_id"]: m for m in mems if m["metadata"]["kind"] == "chunk"}
    assert chunks["chunk:t:D2:2"]["metadata"]["image"]["caption"].startswith("a painting")
    assert chunks["chunk:t:D1:1"]["created_at"] == "2023-05-08T13:56:00"
    # the skill's merge keeps the embedding of a merged frame's first turn only
    assert not chunks["chunk:t:D1:2"]["metadata"]["embedded"]
    assert chunks["chunk:t:D1:1"]["metadata"]["embedded"]
    # per turn a frame and a fact request, one judge per window, and the merged frames' facts
    # extracted again from their first turn
    chat = hashes(rows1, "seem_skill", "chat")
    assert len(chat) == 2 * TURNS + 3 + 2
    assert _phases(rows1) == {"build.frames", "build.fusion", "build.graph"}
    assert rows1["error"].null_count() == rows1.height
    # a rebuild into a fresh store: the same bodies in the same order, the same memories
    assert hashes(rows2, "seem_skill", "chat") == chat
    assert hashes(rows2, "seem_skill", "embeddings") == hashes(rows1, "seem_skill", "embeddings")
    assert rebuilt["memories"] == mems
    assert {"memories.json", "chunk_store.json", "nx_graph.json", "facts.json"} <= {
        p.name for p in store.iterdir()}

    with _worker(tmp_path, "2") as w2:  # another process: the same build, then the search
        assert w2.hello()["op"] == "ready"
        with front(SPEC) as f:
            again = w2.ask(request(SPEC, "build", f, tmp_path / "s3", sessions=_sessions()))
            rows3 = f.take_rows("system_build")
            before = (store / "memories.json").read_bytes()
            found = w2.ask(request(SPEC, "search", f, store, questions=QUESTIONS, k=3))
            rows_s = f.take_rows("system_search")
    assert hashes(rows3, "seem_skill", "chat") == chat and again["memories"] == mems
    assert (store / "memories.json").read_bytes() == before  # a search leaves the store
    ids = {m["memory_id"]: m for m in mems}
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        frames_hit = [h for h in hits if h["kind"] == "memory"]
        facts_hit = [h for h in hits if h["kind"] == "relation"]
        assert 1 <= len(frames_hit) <= 3 and 1 <= len(facts_hit) <= 5  # top_k_facts 5
        assert hits == frames_hit + facts_hit  # the skill's order: memories, then facts
        for h in hits:
            assert h["memory_id"] in ids and isinstance(h["score"], float)
        # lite mode: the structured memory the skill hands an agent
        assert frames_hit[0]["text"] == "[Structured Memory]\n" + ids[frames_hit[0]["memory_id"]]["text"]
        assert facts_hit[0]["text"] == ids[facts_hit[0]["memory_id"]]["text"]
    # hybrid_rrf: per question its embedding and its 5W1H request
    assert len(hashes(rows_s, "seem_skill", "chat")) == len(QUESTIONS)
    assert len(hashes(rows_s, "seem_skill", "embeddings")) == len(QUESTIONS)
    assert _phases(rows_s) == {"search.retrieve"}
    logs = w1.log_text() + w2.log_text()
    assert "network refused" not in logs


@needs_seem
def test_ppr_and_max_mode_as_the_docs_describe(tmp_path: Path) -> None:
    """system.options={retrieve_strategy:ppr,mode:max}: no 5W1H request, and each hit is one
    turn (its frame and its own text), the retrieved turns' frames' other turns added up to
    2 x top_k."""
    with _worker(tmp_path, "ppr") as worker:
        assert worker.hello(retrieve_strategy="ppr", mode="max")["op"] == "ready"
        with front(SPEC) as f:
            worker.ask(request(SPEC, "build", f, tmp_path / "s", sessions=_sessions()))
            f.take_rows("system_build")
            found = worker.ask(request(SPEC, "search", f, tmp_path / "s", questions=QUESTIONS,
                                       k=2))
            rows = f.take_rows("system_search")
    assert hashes(rows, "seem_skill", "chat") == []
    for q in QUESTIONS:
        turns = [h for h in found["results"][q["question_id"]] if h["kind"] == "memory"]
        assert 1 <= len(turns) <= 4 and all(h["memory_id"].startswith("chunk:") for h in turns)
        assert all("[Original Observation]" in h["text"] for h in turns)


def _not_json(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": "I am not sure what you mean."}


def _wrong_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps({"items": [{"x": 1}]})}


@needs_seem
def test_garbled_replies_are_counted_and_the_unit_completes(tmp_path: Path) -> None:
    windows = 3  # 3 + 3 + the flush of the last one
    # prose: every frame falls back to the turn's text, no facts, every window unmerged
    built = _build_once(tmp_path, "prose", _not_json)
    frames = [m for m in built["memories"] if m["metadata"]["kind"] == "episodic"]
    assert len(frames) == TURNS and all(m["metadata"]["events"] == [] for m in frames)
    assert built["dropped"] == 2 * TURNS + windows
    assert {d["where"] for d in built["drops"]} == {"frames", "graph", "fusion"}
    # JSON with other keys: the frame's KeyError is printed; the facts and the judgment are
    # dropped silently by the skill and counted here
    built = _build_once(tmp_path, "keys", _wrong_keys)
    assert built["dropped"] == 2 * TURNS + windows
    silent = [d for d in built["drops"] if d["why"].startswith("JSON without")]
    assert len(silent) == TURNS + windows
    # a search whose 5W1H replies are unusable: counted, and the question still gets hits
    with _worker(tmp_path, "q") as worker:
        assert worker.hello()["op"] == "ready"
        with front(SPEC) as f:
            worker.ask(request(SPEC, "build", f, tmp_path / "good", sessions=_sessions()))
        with front(_not_json) as f:
            found = worker.ask(request(SPEC, "search", f, tmp_path / "good",
                                       questions=QUESTIONS, k=3))
    assert found["dropped"] == len(QUESTIONS)
    assert {d["where"] for d in found["drops"]} == {"retrieve"}
    assert all(found["results"][q["question_id"]] for q in QUESTIONS)


@needs_seem
def test_a_failed_call_to_the_front_fails_the_unit(tmp_path: Path) -> None:
    """The skill swallows every exception of its LLM client; a call the front could not
    answer still fails the conversation (an error reply), and the worker serves the next."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        system = str(body["messages"][0]["content"])
        if '"facts"' in system:
            raise RuntimeError("the model server is gone")
        return scripted_reply(body)

    with _worker(tmp_path, "broken") as worker:
        assert worker.hello()["op"] == "ready"
        with front(broken) as f:
            bad = worker.call(request(SPEC, "build", f, tmp_path / "s1", sessions=_sessions()))
        assert bad["op"] == "error" and "InternalServerError" in bad["error"], bad
        with front(SPEC) as f:
            good = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=_sessions()))
        assert good["dropped"] == 0 and good["memories"]


@needs_seem
def test_an_unknown_option_is_refused_at_hello(tmp_path: Path) -> None:
    with _worker(tmp_path, "opt") as worker:
        bad = worker.hello(retrieve_strategie="ppr")
    assert bad["op"] == "error" and "retrieve_strategie" in bad["error"]


def test_scripted_reply_tells_the_skills_requests_by_their_json_keys() -> None:
    def body(system: str, user: str) -> dict[str, Any]:
        return {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": user}],
                "response_format": {"type": "json_object"}}

    frame = json.loads(scripted_reply(body(
        'Output {"summary": "...", "events": [...]}',
        "Conversation timestamp: 2023-05-08T13:56:00\n\nExtract ...:\n\n"
        "[Melanie]: I painted a sunrise over Lake Tahoe.\n[Image: a lake]"))["content"])
    assert frame["summary"].startswith("Melanie said: I painted")
    assert frame["events"][0]["participants"] == ["Melanie", "Lake", "Tahoe"]
    assert frame["events"][0]["time"] == "2023-05-08"
    facts = json.loads(scripted_reply(body(
        'Output {"facts": [["s", "p", "o"]]}',
        "Extract facts from the following text:\n\nWe hiked in Denver with friends."))["content"])
    assert facts == {"facts": [["Denver", "mentions", "hiked"], ["Denver", "mentions", "friends"]]}
    judge = json.loads(scripted_reply(body(
        'Output {"merge_groups": [...]}',
        "=== PENDING MEMORIES (window of new observations) ===\n\n"
        "PENDING [pending_id=p1, real_id=aa]:\n- Summary: A.\n- Events: [{\"action\": [\"x\"]}]\n\n"
        "PENDING [pending_id=p2, real_id=bb]:\n- Summary: B.\n- Events: []\n\n"
        "PENDING [pending_id=p3, real_id=cc]:\n- Summary: C.\n- Events: []\n"))["content"])
    groups = judge["merge_groups"]
    assert [g["members"] for g in groups] == [["p1", "p2"], ["p3"]]
    assert groups[0]["integrated_summary"] == "A. B." and groups[0]["coherence_level"] == "STRONG"
    assert groups[0]["integrated_events"] == [{"action": ["x"]}]
    query = json.loads(scripted_reply(body(
        'Output {"who": null, "what": null, "when": null}',
        "Extract 5W1H from: What did Melanie paint in Tahoe?"))["content"])
    assert query["who"] == "Melanie, Tahoe" and query["what"] == "melanie paint tahoe"
