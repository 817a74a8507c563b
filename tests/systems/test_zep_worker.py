"""The Zep worker (systems/workers/zep_worker.py: graphiti-core over Kùzu) behind our recording
front with `systems.zep.scripted_reply` as its upstream (no model) and hash vectors as its
encoder. The worker tests need the system's own environment
(`$STRUCTMEM_SYSTEMS_DIR/zep/bin/python`, `python jobs/data.py systems install zep`) and are
skipped without it; the scripted replies are checked with our Python.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.zep import SPEC, scripted_reply
from tests.systems.worker_driver import Front, WorkerProcess, front, needs_env, request, session

needs_zep = needs_env("zep")
pytestmark = pytest.mark.systems
CLOCK = "2023-05-08T13:56:00"

SESSIONS = [  # ISO dates, as stages.build_payloads sends them
    session(1, "2023-05-08T13:56:00", [
        ("Caroline", "I went to the LGBTQ support group yesterday."),
        ("Melanie", "That sounds great! I painted a lake sunrise.")]),
    session(2, "2023-05-25T13:14:00", [
        ("Caroline", "I am researching adoption agencies in Boston."),
        ("Melanie", "I ran a charity race for mental health on Saturday.")]),
]
EPISODES = 4  # one per message
QUESTIONS = [{"question_id": "conv-t:q0", "question": "Where is Caroline researching adoption?"}]


@pytest.fixture(name="front")
def front_fixture() -> Iterator[Front]:
    with front(SPEC) as f:
        yield f


def _worker(tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=CLOCK, settings={"top_k": 10})


def _hello(w: WorkerProcess, **settings: Any) -> None:
    ready = w.hello(**settings)
    assert ready["op"] == "ready" and ready["version"] == "0.31.2", ready


def _req(op: str, f: Front, store: Path, unit: str = "conv-t", **kw: Any) -> dict[str, Any]:
    return request(SPEC, op, f, store, unit=unit, **kw)


def _run(tmp: Path, f: Front, name: str, store: Path, *, search: bool = True,
         **settings: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    with _worker(tmp, name) as w:
        _hello(w, **settings)
        built = w.call(_req("build", f, store, sessions=SESSIONS))
        found = w.call(_req("search", f, store, questions=QUESTIONS, k=10)) if search else None
    assert "network refused" not in w.log_text()
    return built, found


@needs_zep
def test_build_and_search_are_reproducible(tmp_path: Path, front: Front) -> None:
    built, found = _run(tmp_path, front, "a", tmp_path / "store_a")
    assert built["op"] == "built", built
    mems = built["memories"]
    facts = [m for m in mems if m["kind"] == "memory"]
    assert facts and {m["kind"] for m in mems} == {"memory", "entity"}
    assert all(m["text"] for m in mems) and all(m["owner"] is None for m in mems)
    # a fact is dated by its episode (the session), not by the worker's clock
    assert {m["created_at"][:19] for m in facts} == {s["session_time"] for s in SESSIONS}
    assert built["dropped"] == 0 and built["drops"] == [] and built["episodes"] == EPISODES
    assert found is not None and found["op"] == "found", found
    hits = found["results"]["conv-t:q0"]
    assert hits and {h["kind"] for h in hits} <= {"memory", "entity"}
    assert any(h["kind"] == "memory" for h in hits)  # facts come through the cross-encoder
    assert all(isinstance(h["score"], float) for h in hits)
    assert sum(h["kind"] == "memory" for h in hits) <= 10
    first = list(front.chat_bodies)
    bodies = [json.loads(raw) for raw in first]
    # graphiti's own cross-encoder: one logprob call per candidate fact
    rerank = [b for b in bodies if b.get("logprobs")]
    assert rerank and all(b["top_logprobs"] == 2 and b["max_tokens"] == 1 for b in rerank)
    # every other call asks for a json_schema reply (no strict) with graphiti's 16,384 budget
    for body in bodies:
        if not body.get("logprobs"):
            assert body["response_format"]["type"] == "json_schema", body
            assert "strict" not in body["response_format"]["json_schema"]
            assert body["max_tokens"] == 16384
    rows = front.take_rows()
    assert rows.height > 0 and rows["parse_ok"].all()

    # A rebuild in a fresh process into a fresh store: the same chat bodies, byte for byte
    # (clock frozen, ids seeded), the same memory ids and the same hits. Concurrent calls
    # (graphiti gathers per edge) may arrive in another order: compared as multisets.
    front.chat_bodies.clear()
    built2, found2 = _run(tmp_path, front, "b", tmp_path / "store_b")
    assert sorted(front.chat_bodies) == sorted(first)
    assert built2["memories"] == mems and found2 == found


@needs_zep
@pytest.mark.parametrize(("garble", "why"), [
    ("I am not sure what you mean.", "JSONDecodeError"),  # retried (4 attempts), then raised
    ('{"items": [{"x": 1}]}', "ValidationError"),  # wrong keys: raised at once
])
def test_garbled_replies_drop_episodes_and_the_unit_completes(tmp_path: Path, garble: str,
                                                              why: str) -> None:
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if (body.get("response_format") or {}).get("json_schema", {}).get("name") == \
                "ExtractedEntities":
            return {"content": garble}
        return scripted_reply(body)

    with front(broken) as f:
        t0 = time.monotonic()
        built, found = _run(tmp_path, f, "bad", tmp_path / "store")
        wall = time.monotonic() - t0
    assert built["op"] == "built", built
    assert built["memories"] == [] and built["dropped"] == EPISODES
    assert built["drops"] == [{"where": "episode", "why": why}] * EPISODES
    assert found is not None and found["results"] == {"conv-t:q0": []}
    # graphiti's 5-120 s back-off is gone: a lost episode costs well under 2 s
    assert wall < 2 * EPISODES + 15, wall
    attempts = 4 if why == "JSONDecodeError" else 1
    assert len(f.chat_bodies) == EPISODES * attempts


@needs_zep
def test_a_fact_graphiti_skips_is_counted(tmp_path: Path) -> None:
    """graphiti logs and skips an extracted fact whose entity name is empty."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        if (body.get("response_format") or {}).get("json_schema", {}).get("name") == \
                "ExtractedEdges":
            edges = json.loads(reply["content"])["edges"]
            edges.append({**edges[0], "target_entity_name": " ", "fact": "dangling"})
            reply = {"content": json.dumps({"edges": edges})}
        return reply

    with front(broken) as f:
        built, _ = _run(tmp_path, f, "skip", tmp_path / "store", search=False)
    assert built["op"] == "built", built
    assert built["drops"] == [{"where": "fact", "why": "empty entity name"}] * EPISODES
    assert any(m["kind"] == "memory" for m in built["memories"])
    assert all(m["text"] != "dangling" for m in built["memories"])


@needs_zep
def test_one_worker_serves_several_units_and_survives_a_bad_request(tmp_path: Path,
                                                                     front: Front) -> None:
    """Each unit's Kùzu file is closed after use (graphiti's close() leaves it open); a failed
    request is one error reply with the log's tail, and the worker goes on."""
    with _worker(tmp_path, "multi") as w:
        _hello(w)
        bad = w.call({"op": "build", "unit": "x"})
        assert bad["op"] == "error" and bad["unit"] == "x" and bad["error"].startswith("KeyError")
        assert "Traceback" in bad["log_tail"]
        counts = []
        for unit in ("u1", "u2", "u1"):
            b = w.call(_req("build", front, tmp_path / unit, unit=unit, sessions=SESSIONS))
            assert b["op"] == "built" and b["dropped"] == 0, b
            counts.append(len(b["memories"]))
        assert counts[0] == counts[1] == counts[2] > 0  # a rebuild starts from an empty graph
        for unit in ("u1", "u2"):
            f = w.call(_req("search", front, tmp_path / unit, unit=unit, questions=QUESTIONS,
                            k=1))
            assert f["op"] == "found", f
            kinds = [h["kind"] for h in f["results"]["conv-t:q0"]]
            assert kinds.count("memory") <= 1 and kinds.count("entity") <= 1 and kinds


# --- the scripted replies, with our own Python (no zep environment needed) ----------------

def _schema(name: str, prompt: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "..."},
                         {"role": "user", "content": prompt}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": name, "schema": {}}}}


def test_scripted_reply_answers_graphiti_prompts() -> None:
    msg = "Caroline(user): 1:56 pm on 8 May, 2023: I saw Boston and the LGBTQ parade."
    ents = json.loads(scripted_reply(_schema(
        "ExtractedEntities", f"<CURRENT MESSAGE>\n{msg}\n</CURRENT MESSAGE>"))["content"])
    assert [e["name"] for e in ents["extracted_entities"]] == ["Caroline", "Boston", "LGBTQ"]
    edges = json.loads(scripted_reply(_schema(
        "ExtractedEdges",
        f"<CURRENT_MESSAGE>\n{msg}\n</CURRENT_MESSAGE>\n<ENTITIES>\n"
        '[{"name": "Caroline", "entity_types": ["Entity"]}, {"name": "Boston"}]\n</ENTITIES>\n'
        "<REFERENCE_TIME>\n2023-05-08 13:56:00+00:00  # ISO 8601\n</REFERENCE_TIME>"))["content"])
    assert edges["edges"] == [{
        "source_entity_name": "Caroline", "target_entity_name": "Boston",
        "relation_type": "MENTIONED",
        "fact": "Caroline mentioned Boston: I saw Boston and the LGBTQ parade",
        "valid_at": "2023-05-08T13:56:00Z", "invalid_at": None, "episode_indices": [0]}]
    dup = json.loads(scripted_reply(_schema(
        "EdgeDuplicate", "<EXISTING FACTS>\n[{'idx': 0, 'fact': 'A'}, {'idx': 1, 'fact': 'B'}]\n"
        "</EXISTING FACTS>\n<NEW FACT>\nB\n</NEW FACT>"))["content"])
    assert dup == {"duplicate_facts": [1], "contradicted_facts": []}
    res = json.loads(scripted_reply(_schema(
        "NodeResolutions", '<ENTITIES>\n[{"id": 0, "name": "boston"}, {"id": 1, "name": "X"}]\n'
        '</ENTITIES>\n<EXISTING ENTITIES>\n[{"candidate_id": 0, "name": "Boston"}]\n'
        "</EXISTING ENTITIES>"))["content"])
    assert [r["duplicate_candidate_id"] for r in res["entity_resolutions"]] == [0, -1]
    # the reranker: True/False with top logprobs (graphiti reads p(True) from them)
    body = {"messages": [{"role": "user", "content":
                          "<PASSAGE>\nCaroline went to Boston\n</PASSAGE>\n"
                          "<QUERY>\nWhere did Caroline go?\n</QUERY>"}],
            "logprobs": True, "top_logprobs": 2, "max_tokens": 1}
    r = scripted_reply(body)
    top = r["logprobs"]["content"][0]["top_logprobs"]
    assert r["content"] == top[0]["token"] == "True" and top[0]["logprob"] < 0
    assert json.loads(scripted_reply({"messages": [{"role": "user", "content": "?"}]})[
        "content"]) == {}
