"""The Mem0 worker (systems/workers/mem0_worker.py) behind our recording front (the "stub").

The stub answers chat with `systems.mem0.scripted_reply` and embeddings with hash vectors and
keeps every request body. The worker tests need mem0's own environment
(`$STRUCTMEM_SYSTEMS_DIR/mem0/bin/python`, `python jobs/data.py systems install mem0`) and are
skipped without it; worker_common's clock, id and network switches are checked with our Python.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.mem0 import GRAPH_SPEC, SPEC, scripted_reply
from structmem_gpu.systems.spec import WORKERS_DIR
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

needs_mem0 = needs_env("mem0")
pytestmark = pytest.mark.systems
CLOCK = "2023-05-08T13:56:00"

SESSIONS = [
    session(1, "1:56 pm on 8 May, 2023", [
        ("Caroline", "I went to the LGBTQ support group yesterday."),
        ("Melanie", "That sounds great! I painted a lake sunrise.")]),
    session(2, "1:14 pm on 25 May, 2023", [
        ("Caroline", "I am researching adoption agencies in Boston."),
        ("Melanie", "I ran a charity race for mental health on Saturday.")]),
]


def _stub(reply: Reply = scripted_reply) -> AbstractContextManager[Front]:
    """Our front over the scripted replies, hash vectors of whole texts as its encoder; it
    keeps every chat and embeddings body as the worker sent it."""
    return front(reply, encoder=text_vectors)


@pytest.fixture
def stub() -> Iterator[Front]:
    with _stub() as s:
        yield s


def _req(op: str, stub: Front, store: Path, **kw: Any) -> dict[str, Any]:
    return request(SPEC, op, stub, store, **kw)


def _run(tmp: Path, stub: Front, name: str, store: Path, *, graph: bool = False,
         search: bool = True, **settings: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    with WorkerProcess(SPEC, tmp, name, clock=CLOCK) as w:
        ready = w.hello(graph=graph, batch_size=2, top_k=10, **settings)
        assert ready["op"] == "ready" and ready["version"] == "1.0.5", ready
        built = w.call(_req("build", stub, store, sessions=SESSIONS))
        found = None
        if search:
            qs = [{"question_id": "conv-t:q0", "question": "Where did Caroline go yesterday?"}]
            found = w.call(_req("search", stub, store, questions=qs, k=10))
    return built, found


@needs_mem0
def test_build_and_search_are_reproducible(tmp_path: Path, stub: Front) -> None:
    store = tmp_path / "store"
    built, found = _run(tmp_path, stub, "a", store)
    assert built["op"] == "built", built
    mems = built["memories"]
    assert mems and {m["owner"] for m in mems} == {"Caroline", "Melanie"}
    assert {m["created_at"] for m in mems} == {s["session_time"] for s in SESSIONS}
    assert built["dropped"] == 0 and built["drops"] == []
    assert found is not None and found["op"] == "found", found
    hits = found["results"]["conv-t:q0"]
    assert hits and all(isinstance(h["score"], float) for h in hits)
    assert {h["owner"] for h in hits} == {"Caroline", "Melanie"}
    # 4 turns, batch 2, two speakers = 4 add() = 4 fact calls + 4 update calls
    first_chat, first_emb = list(stub.chat_bodies), list(stub.embedding_bodies)
    assert len(first_chat) == 8 and len(first_emb) > 0
    assert b"Today's date is 2023-05-08" in first_chat[0]

    # A rerun in a fresh process over the same store: the same bodies, byte for byte, and the
    # same memory ids (clock frozen, ids seeded, the store wiped first).
    stub.chat_bodies.clear()
    stub.embedding_bodies.clear()
    built2, found2 = _run(tmp_path, stub, "b", store)
    assert stub.chat_bodies == first_chat and stub.embedding_bodies == first_emb
    assert built2["memories"] == mems and found2 == found


@needs_mem0
def test_unparseable_facts_are_counted_as_drops(tmp_path: Path) -> None:
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if any('"facts"' in str(m.get("content")) for m in body["messages"]):
            return {"content": "not json"}
        return scripted_reply(body)

    with _stub(broken) as s:
        built, _ = _run(tmp_path, s, "bad", tmp_path / "store", search=False)
    assert built["op"] == "built", built
    assert built["memories"] == [] and built["dropped"] == 4
    assert built["drops"][0] == {"where": "facts", "why": "reply not parsed"}
    assert len(s.chat_bodies) == 4  # no update call follows a lost facts reply


@needs_mem0
def test_graph_mode_adds_relations(tmp_path: Path, stub: Front) -> None:
    assert GRAPH_SPEC.options == {"graph": True} and GRAPH_SPEC.env_name == "mem0"
    built, found = _run(tmp_path, stub, "g", tmp_path / "store", graph=True)
    assert built["op"] == "built" and built["dropped"] == 0, built
    kinds = {m["kind"] for m in built["memories"]}
    assert kinds == {"memory", "relation"}
    assert found is not None and found["op"] == "found", found
    assert {h["kind"] for h in found["results"]["conv-t:q0"]} == {"memory", "relation"}
    tools = [json.loads(b)["tools"][0]["function"]["name"] for b in stub.chat_bodies
             if b"\"tools\"" in b]
    assert {"extract_entities", "establish_relationships", "delete_graph_memory"} <= set(tools)


@needs_mem0
def test_one_worker_serves_several_units_and_survives_a_bad_request(tmp_path: Path,
                                                                     stub: Front) -> None:
    """Each unit's stores are closed after use (qdrant's local mode locks its folder, and
    mem0 reopens MEM0_DIR/migrations_qdrant for every Memory); a failed request is one error
    reply with the log's tail, and the worker goes on."""
    with WorkerProcess(SPEC, tmp_path, "multi", clock=CLOCK) as w:
        assert w.hello()["op"] == "ready"
        bad = w.call({"op": "build", "unit": "x"})
        assert bad["op"] == "error" and bad["unit"] == "x" and bad["error"].startswith("KeyError")
        assert "Traceback" in bad["log_tail"]
        qs = [{"question_id": "q", "question": "Boston?"}]
        for unit in ("u1", "u2", "u1"):
            b = w.call({**_req("build", stub, tmp_path / unit, sessions=SESSIONS), "unit": unit})
            assert b["op"] == "built" and len(b["memories"]) == 4, b
        for unit in ("u1", "u2"):
            f = w.call({**_req("search", stub, tmp_path / unit, questions=qs, k=1), "unit": unit})
            assert f["op"] == "found" and len(f["results"]["q"]) == 2, f  # k per speaker


@needs_mem0
def test_graph_tool_arguments_not_json_drop_the_batch_not_the_unit(tmp_path: Path) -> None:
    """mem0 raises on tool arguments that are not JSON (its vector half has stored the batch's
    memories by then); the worker retries (add.py) and then counts one "add" drop per batch."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        if "establish_relationships" in json.dumps(body.get("tools") or []):
            reply["tool_calls"][0]["function"]["arguments"] = "{not json"
        return reply

    with _stub(broken) as s:
        built, _ = _run(tmp_path, s, "badg", tmp_path / "store", graph=True, search=False,
                        add_attempts=1)
    assert built["op"] == "built", built
    assert built["dropped"] == 4 and {d["where"] for d in built["drops"]} == {"add"}
    assert {m["kind"] for m in built["memories"]} == {"memory"}


# --- worker_common, with our own Python (no mem0 environment needed) ------------------------

def _common(code: str) -> subprocess.CompletedProcess[str]:
    head = f"import sys; sys.path.insert(0, {str(WORKERS_DIR)!r}); import worker_common as wc\n"
    return subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_refuse_network_blocks_other_hosts_and_allows_loopback(stub: Front) -> None:
    port = stub.port
    r = _common(
        "import socket, urllib.request\n"
        "wc.refuse_network()\n"
        "try:\n"
        "    socket.create_connection(('8.8.8.8', 53), timeout=5)\n"
        "except OSError as e:\n"
        "    print('refused:', e)\n"
        "try:\n"
        "    socket.socket().connect(('1.1.1.1', 80))\n"
        "except OSError as e:\n"
        "    print('refused:', e)\n"
        f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n"
        "print('loopback ok')\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refused: network refused by structmem worker: 8.8.8.8",
                                     "refused: network refused by structmem worker: 1.1.1.1",
                                     "loopback ok"]


def test_freeze_clock_and_seed_ids() -> None:
    r = _common(
        "import datetime, pickle\n"
        "real = datetime.datetime(2020, 1, 2)  # made before the freeze, as C code makes them\n"
        "wc.freeze_clock('2023-05-08T13:56:00')\n"
        "assert pickle.loads(pickle.dumps(real)) == real and isinstance(real, datetime.datetime)\n"
        "import datetime, uuid, time\n"
        "from datetime import datetime as D, date, timezone\n"
        "print(D.now().isoformat(), D.utcnow().isoformat(), date.today().isoformat())\n"
        "print(D.now(timezone.utc).isoformat(), isinstance(D.fromtimestamp(0), D),\n"
        "      isinstance(datetime.datetime.fromisoformat('2020-01-01'), D), time.time() > 1.7e9)\n"
        "wc.seed_ids('u1'); a = [uuid.uuid4() for _ in range(2)]\n"
        "wc.seed_ids('u1'); b = [uuid.uuid4() for _ in range(2)]\n"
        "wc.seed_ids('u2'); c = uuid.uuid4()\n"
        "print(a == b, a[0] != a[1], c not in a, a[0].version)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "2023-05-08T13:56:00 2023-05-08T13:56:00 2023-05-08",
        "2023-05-08T13:56:00+00:00 True True True",
        "True True True 4"]


def test_scripted_reply_answers_mem0_prompts() -> None:
    facts = scripted_reply({"messages": [
        {"role": "system", "content": 'Return json with a key as "facts" ...'},
        {"role": "user", "content": "Input:\nuser: Caroline: I went to the support group.\n"
                                    "assistant: Melanie: Great!\n"}]})
    assert json.loads(facts["content"]) == {"facts": ["I went to the support group."]}
    prompt = ("...\n    Below is the current content of my memory which I have collected till "
              "now. ...\n\n    ```\n    [{'id': '0', 'text': 'Likes tea'}]\n    ```\n\n"
              "    The new retrieved facts are mentioned in the triple backticks. ...\n\n"
              "    ```\n    ['Likes tea', 'Went to Boston']\n    ```\n")
    upd = json.loads(scripted_reply({"messages": [{"role": "user", "content": prompt}]})["content"])
    assert upd == {"memory": [{"id": "0", "text": "Likes tea", "event": "NONE"},
                              {"id": "1", "text": "Went to Boston", "event": "ADD"}]}
    tool = {"type": "function", "function": {"name": "extract_entities"}}
    ents = scripted_reply({"messages": [{"role": "user", "content": "Caroline: I saw Boston."}],
                           "tools": [tool]})["tool_calls"][0]
    assert json.loads(ents["function"]["arguments"])["entities"][:2] == [
        {"entity": "caroline", "entity_type": "person"},
        {"entity": "boston", "entity_type": "thing"}]
