"""The HippoRAG 2 worker (systems/workers/hipporag_worker.py: hipporag 2.0.0a4) behind our
recording front with `systems.hipporag.scripted_reply` as its upstream (no model) and hash
vectors as its encoder: a build indexes one passage per turn and extracts triples, a search
returns the top-k passages, a rebuild into a fresh store sends the same chat bodies, replies
HippoRAG cannot parse are counted as dropped while the unit completes.

Heavy tier (the environment is ~1.5 GB: torch): needs `$STRUCTMEM_SYSTEMS_DIR/hipporag/bin/python`
(`python jobs/data.py systems install hipporag`) and is skipped without it; the scripted replies
are checked with our Python.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.hipporag import SPEC, scripted_reply
from tests.systems.worker_driver import (
    Front,
    Reply,
    WorkerProcess,
    front,
    needs_env,
    request,
    session,
    text_vectors,
)

needs_hipporag = needs_env("hipporag")
pytestmark = [pytest.mark.systems_heavy]
CLOCK = "2023-05-08T13:56:00"
WHEN = "2023-05-08T13:56:00"
TURNS = [("Caroline", "I went to the LGBTQ support group yesterday."),
         ("Melanie", "That sounds great! I painted a lake sunrise last week."),
         ("Caroline", "I am researching adoption agencies in Boston."),
         ("Melanie", "I ran a charity race for mental health on Saturday."),
         ("Caroline", "My friend Jordan helped me move to Boston."),
         ("Melanie", "Luna, my dog, loves the beach in Maine.")]
SESSIONS = [session(1, WHEN, TURNS)]
QUESTIONS = [{"question_id": "conv-t:q0", "question": "Where is Caroline researching adoption?"},
             {"question_id": "conv-t:q1", "question": "What did Melanie paint?"}]
K = 5  # SEEM: HippoRAG 2's top-5 chunks


def _front(reply: Reply = scripted_reply) -> AbstractContextManager[Front]:
    """Whole-text hash vectors: HippoRAG's graph search asserts that its nodes' vectors differ
    (bag-of-words vectors of two entities with the same words would not)."""
    return front(reply, encoder=text_vectors)


@pytest.fixture(name="front")
def front_fixture() -> Iterator[Front]:
    with _front() as f:
        yield f


class Worker(WorkerProcess):
    def __init__(self, tmp: Path, name: str) -> None:
        super().__init__(SPEC, tmp, name, clock=CLOCK, settings={"top_k": K})

    def hello(self, **settings: Any) -> dict[str, Any]:
        ready = super().hello(**settings)
        assert ready["op"] == "ready" and ready["version"] == "2.0.0a4", ready
        return ready


def _req(op: str, f: Front, store: Path, unit: str = "conv-t", **kw: Any) -> dict[str, Any]:
    return request(SPEC, op, f, store, unit=unit, **kw)


def _run(tmp: Path, f: Front, name: str, store: Path, *, sessions: list[Any] = SESSIONS,
         search: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
    with Worker(tmp, name) as w:
        w.hello()
        built = w.call(_req("build", f, store, sessions=sessions))
        found = w.call(_req("search", f, store, questions=QUESTIONS, k=K)) if search else None
    log = w.log_text()
    assert "network refused" not in log
    # a C extension imported after the clock freeze sees the frozen datetime classes
    assert "size changed" not in log
    return built, found


def _kind(body: bytes) -> str:
    text = json.dumps(json.loads(body)["messages"])
    for mark, kind in (("fact_before_filter", "filter"), ("RDF (Resource", "triples"),
                       ("extract named entities", "ner")):
        if mark in text:
            return kind
    return "other"


@needs_hipporag
def test_build_and_search_are_reproducible(tmp_path: Path, front: Front) -> None:
    built, found = _run(tmp_path, front, "a", tmp_path / "store_a")
    assert built["op"] == "built", built
    mems = built["memories"]
    passages = [m for m in mems if m["kind"] == "passage"]
    triples = [m for m in mems if m["kind"] == "triple"]
    assert {m["kind"] for m in mems} == {"passage", "triple"}
    # one passage per turn: "<session time> <speaker>: <text>", owned by its speaker
    assert [p["text"] for p in passages] == [f"{WHEN} {w}: {t}" for w, t in TURNS]
    assert [p["owner"] for p in passages] == [w for w, _ in TURNS]
    assert {p["created_at"] for p in passages} == {WHEN}
    assert [p["metadata"]["event_ids"] for p in passages] == [[f"u:D1:{i + 1}"]
                                                              for i in range(len(TURNS))]
    assert triples and all(m["text"] and m["metadata"]["passages"] for m in triples)
    assert built["dropped"] == 0 and built["drops"] == []
    # two requests per passage (NER, then triples conditioned on its entities)
    kinds = [_kind(b) for b in front.chat_bodies]
    assert sorted(kinds[:12]) == ["ner"] * 6 + ["triples"] * 6
    for body in map(json.loads, front.chat_bodies):
        # not a "gpt" model name: HippoRAG sends max_tokens (its 2,048; the filter's 512)
        assert body["temperature"] == 0 and "max_completion_tokens" not in body
        assert body["max_tokens"] == (512 if _kind(json.dumps(body).encode()) == "filter"
                                      else 2048)

    assert found is not None and found["op"] == "found", found
    ids = {p["memory_id"] for p in passages}
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        assert 0 < len(hits) <= K
        assert all(h["kind"] == "passage" and h["memory_id"] in ids for h in hits)
        assert all(isinstance(h["score"], float) for h in hits)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert found["results"]["conv-t:q0"][0]["owner"] in ("Caroline", "Melanie")
    assert kinds[12:] == ["filter", "filter"]  # the recognition-memory filter, per question
    rows = front.take_rows()
    assert rows.height > 0 and rows["parse_ok"].all()
    first = list(front.chat_bodies)

    # A rebuild in a fresh process into a fresh store: the same chat bodies, byte for byte
    # (HippoRAG's OpenIE runs in threads: compared as multisets), the same memories and hits.
    front.chat_bodies.clear()
    built2, found2 = _run(tmp_path, front, "b", tmp_path / "store_b")
    assert sorted(front.chat_bodies) == sorted(first)
    assert built2["memories"] == mems and found2 == found


GARBLED = {
    "no JSON": "I am not sure what you mean.",
    "wrong keys": '{"items": [{"x": 1}]}',
    "truncated JSON": '{"named_entities": ["Caroline", "Bos',
}


@needs_hipporag
@pytest.mark.parametrize("kind", list(GARBLED))
def test_garbled_extraction_is_counted_and_the_unit_completes(tmp_path: Path, kind: str) -> None:
    """HippoRAG keeps empty entity and triple lists for replies it cannot parse: each is one
    drop (per passage and step); the passages are still indexed and searched (dense)."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if _kind(json.dumps(body).encode()) in ("ner", "triples"):
            return {"content": GARBLED[kind]}
        return scripted_reply(body)

    with _front(broken) as f:
        built, found = _run(tmp_path, f, "bad", tmp_path / "store")
    assert built["op"] == "built", built
    assert [m["kind"] for m in built["memories"]] == ["passage"] * len(TURNS)
    assert built["dropped"] == 2 * len(TURNS)
    assert sorted(d["where"] for d in built["drops"]) == ["ner"] * 6 + ["triples"] * 6
    assert {d["passage"] for d in built["drops"]} == {m["memory_id"] for m in built["memories"]}
    assert found is not None and found["op"] == "found", found
    # no fact to filter: no filter call, HippoRAG's dense passage retrieval answers
    assert all(len(found["results"][q["question_id"]]) == K for q in QUESTIONS)
    assert found["dropped"] == 0
    assert len(f.chat_bodies) == 2 * len(TURNS)


@needs_hipporag
def test_empty_answers_are_not_drops_short_triples_and_a_lost_filter_are(tmp_path: Path) -> None:
    """`{"named_entities": []}` is an answer, not a loss; a triple of two items is skipped by
    HippoRAG (a drop); a fact-filter reply it cannot parse makes it fall back to dense
    retrieval (a drop of the search)."""
    def odd(body: Mapping[str, Any]) -> dict[str, Any]:
        kind = _kind(json.dumps(body).encode())
        reply = scripted_reply(body)
        if kind == "ner" and "Melanie:" in body["messages"][-1]["content"]:
            return {"content": '{"named_entities": []}'}
        if kind == "triples":
            triples = json.loads(reply["content"])["triples"]
            return {"content": json.dumps({"triples": [*triples, ["only", "two"]]})}
        if kind == "filter":
            return {"content": "[[ ## fact_after_filter ## ]]\nsome facts\n\n[[ ## completed ## ]]"}
        return reply

    with _front(odd) as f:
        built, found = _run(tmp_path, f, "odd", tmp_path / "store")
    assert built["op"] == "built", built
    assert built["drops"] == [{"where": "triples", "why": "triple not of 3 items",
                               "passage": d["passage"]} for d in built["drops"]]
    assert built["dropped"] == len(TURNS)  # one short triple per passage
    assert any(m["kind"] == "triple" for m in built["memories"])
    assert found is not None and found["op"] == "found", found
    assert found["drops"] == [{"where": "rerank",
                               "why": "fact filter reply not parsed (dense retrieval instead)"}] * 2
    assert all(len(found["results"][q["question_id"]]) == K for q in QUESTIONS)


@needs_hipporag
def test_one_worker_serves_several_units_and_survives_a_bad_request(tmp_path: Path,
                                                                     front: Front) -> None:
    with Worker(tmp_path, "multi") as w:
        w.hello()
        bad = w.call({"op": "build", "unit": "x"})
        assert bad["op"] == "error" and bad["unit"] == "x" and bad["error"].startswith("KeyError")
        assert "Traceback" in bad["log_tail"]
        one = [{**SESSIONS[0], "turns": SESSIONS[0]["turns"][:2]}]
        counts = []
        for unit, sessions in (("u1", SESSIONS), ("u2", one), ("u1", SESSIONS)):
            b = w.call(_req("build", front, tmp_path / unit, unit=unit, sessions=sessions))
            assert b["op"] == "built" and b["dropped"] == 0, b
            counts.append(b["passages"])
        assert counts == [6, 2, 6]  # a rebuild starts from an empty store
        for unit, n in (("u1", 6), ("u2", 2)):
            f = w.call(_req("search", front, tmp_path / unit, unit=unit, questions=QUESTIONS,
                            k=K))
            assert f["op"] == "found", f
            assert all(len(v) == min(K, n) for v in f["results"].values())
        nothing = w.call(_req("search", front, tmp_path / "never", unit="never",
                              questions=QUESTIONS, k=K))
        assert nothing["op"] == "error" and "build it first" in nothing["error"]


@needs_hipporag
def test_a_call_that_fails_at_the_front_fails_the_unit(tmp_path: Path) -> None:
    """HippoRAG swallows any exception of an extraction call; the worker does not let a
    failed request pass as an empty extraction."""
    def failing(body: Mapping[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the model server is down")

    one = [{**SESSIONS[0], "turns": SESSIONS[0]["turns"][:1]}]
    with _front(failing) as f:
        built, _ = _run(tmp_path, f, "down", tmp_path / "store", sessions=one, search=False)
    assert built["op"] == "error", built
    assert "failed at the front" in built["error"] and "InternalServerError" in built["error"]


# --- the scripted replies, with our own Python (no hipporag environment needed) ---------------

def test_scripted_reply_answers_hipporag_prompts() -> None:
    passage = f"{WHEN} Caroline: I moved to Boston with Jordan."
    ner = scripted_reply({"messages": [
        {"role": "system", "content": "Your task is to extract named entities from the given "
                                      "paragraph. \nRespond with a JSON list of entities.\n"},
        {"role": "user", "content": "Radio City ..."}, {"role": "assistant", "content": "{}"},
        {"role": "user", "content": passage}]})
    assert json.loads(ner["content"]) == {"named_entities": ["Caroline", "Boston", "Jordan"]}
    tri = scripted_reply({"messages": [
        {"role": "system", "content": "Your task is to construct an RDF (Resource Description "
                                      "Framework) graph from the given passages ..."},
        {"role": "user", "content": "Convert the paragraph into a JSON dict, it has a named "
                                    f"entity list and a triple list.\nParagraph:\n```\n{passage}"
                                    '\n```\n\n{"named_entities": ["Caroline", "Boston"]}\n'}]})
    assert json.loads(tri["content"]) == {"triples": [["Caroline", "mentioned", "Boston"]]}
    facts = {"fact": [["melanie", "mentioned", "luna"], ["caroline", "mentioned", "boston"]]}
    flt = scripted_reply({"messages": [
        {"role": "system", "content": "Your input fields are: ..."},
        {"role": "user", "content": "[[ ## question ## ]]\nWhere did Caroline move?\n\n"
                                    f"[[ ## fact_before_filter ## ]]\n{json.dumps(facts)}\n\n"
                                    "Respond with the corresponding output fields, starting "
                                    "with the field `[[ ## fact_after_filter ## ]]` ..."}]})
    head, body = flt["content"].split("\n", 1)
    assert head == "[[ ## fact_after_filter ## ]]" and body.endswith("[[ ## completed ## ]]")
    assert json.loads(body.split("\n\n")[0]) == {"fact": [["caroline", "mentioned", "boston"]]}
    qa = scripted_reply({"messages": [
        {"role": "system", "content": "As an advanced reading comprehension assistant, ..."},
        {"role": "user", "content": f"Wikipedia Title: {passage}\n\nQuestion: Where?\nThought: "}]})
    assert qa["content"].endswith("Answer: I moved to Boston with Jordan.")
    assert scripted_reply({"messages": [{"role": "user", "content": "?"}]})["content"]
