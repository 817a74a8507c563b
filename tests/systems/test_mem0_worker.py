"""The Mem0 worker (systems/workers/mem0_worker.py) against a loopback OpenAI-compatible stub.

The stub answers chat with `systems.mem0.scripted_reply` and embeddings with hash vectors and
records every request body. The worker tests need mem0's own environment
(`$STRUCTMEM_SYSTEMS_DIR/mem0/bin/python`, `python jobs/data.py systems install mem0`) and are
skipped without it; worker_common's clock, id and network switches are checked with our Python.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.mem0 import GRAPH_SPEC, SPEC, scripted_reply
from structmem_gpu.systems.spec import WORKERS_DIR

ROOT = Path(__file__).resolve().parents[2]
# conf/paths/default.yaml: systems_dir = STRUCTMEM_SYSTEMS_DIR, else <root>/.systems
SYSTEMS_DIR = Path(os.environ.get("STRUCTMEM_SYSTEMS_DIR") or ROOT / ".systems")
MEM0_PY = SYSTEMS_DIR / "mem0" / "bin" / "python"
needs_env = pytest.mark.skipif(
    not MEM0_PY.exists(),
    reason=f"no mem0 environment at {MEM0_PY} (set STRUCTMEM_SYSTEMS_DIR; "
           "`python jobs/data.py systems install mem0`)")
pytestmark = pytest.mark.systems
CLOCK = "2023-05-08T13:56:00"
DIMS = 16


def _session(index: int, time: str, *turns: tuple[str, str]) -> dict[str, Any]:
    return {"session_index": index, "session_time": time,
            "turns": [{"event_id": f"u:D{index}:{i + 1}", "speaker": who, "text": text}
                      for i, (who, text) in enumerate(turns)]}


SESSIONS = [
    _session(1, "1:56 pm on 8 May, 2023",
             ("Caroline", "I went to the LGBTQ support group yesterday."),
             ("Melanie", "That sounds great! I painted a lake sunrise.")),
    _session(2, "1:14 pm on 25 May, 2023",
             ("Caroline", "I am researching adoption agencies in Boston."),
             ("Melanie", "I ran a charity race for mental health on Saturday.")),
]


Reply = Callable[[Mapping[str, Any]], dict[str, Any]]


class Stub:
    """A loopback /v1/chat/completions + /v1/embeddings server recording request bodies."""

    def __init__(self, reply: Reply = scripted_reply) -> None:
        self.reply = reply
        self.chat: list[bytes] = []
        self.embeddings: list[bytes] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw)
                if self.path.endswith("/chat/completions"):
                    with stub.lock:
                        stub.chat.append(raw)
                    out = stub._chat(body)
                elif self.path.endswith("/embeddings"):
                    with stub.lock:
                        stub.embeddings.append(raw)
                    out = stub._embed(body)
                else:
                    self.send_error(404)
                    return
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        message = {"role": "assistant", "content": None, **self.reply(body)}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return {"id": "stub", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def _embed(self, body: Mapping[str, Any]) -> dict[str, Any]:
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dims = int(body.get("dimensions") or DIMS)
        data = []
        for i, text in enumerate(inputs):
            h = hashlib.sha256(str(text).encode()).digest() * (dims // 8 + 1)
            vec = [b / 255.0 - 0.5 for b in h[:dims]]
            if body.get("encoding_format") == "base64":  # the SDK decodes little-endian float32
                emb: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        return {"object": "list", "data": data, "model": body.get("model"),
                "usage": {"prompt_tokens": 0, "total_tokens": 0}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Worker:
    def __init__(self, tmp: Path, name: str) -> None:
        env = {**os.environ, **SPEC.env, "MEM0_DIR": str(tmp / f"mem0dir_{name}")}
        self.log = open(tmp / f"worker_{name}.log", "wb")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen([str(MEM0_PY), str(WORKERS_DIR / SPEC.worker)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, cwd=str(tmp))

    def call(self, msg: Mapping[str, Any], timeout: float = 180) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no reply to {msg['op']} within {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"worker died: see {self.log.name}"
        return json.loads(line)

    def close(self) -> int:
        if self.proc.poll() is None:
            self.call_exit()
        self.log.close()
        return self.proc.returncode

    def call_exit(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(b'{"op": "exit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def _req(op: str, stub: Stub, store: Path, **kw: Any) -> dict[str, Any]:
    unit = "conv-t"
    return {"op": op, "unit": unit, "base_url": f"{stub.url}/u/mem0/{op}/{unit}/v1",
            "model": "stub-model", "embed_model": "stub-embed", "embed_dims": DIMS,
            "store_dir": str(store), "speakers": ["Caroline", "Melanie"], **kw}


def _run(tmp: Path, stub: Stub, name: str, store: Path, *, graph: bool = False,
         search: bool = True, **settings: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    w = Worker(tmp, name)
    try:
        ready = w.call({"op": "hello", "system": "mem0", "clock": CLOCK,
                        "settings": {"graph": graph, "batch_size": 2, "top_k": 10, **settings}})
        assert ready["op"] == "ready" and ready["version"] == "1.0.5", ready
        built = w.call(_req("build", stub, store, sessions=SESSIONS))
        found = None
        if search:
            qs = [{"question_id": "conv-t:q0", "question": "Where did Caroline go yesterday?"}]
            found = w.call(_req("search", stub, store, questions=qs, k=10))
    finally:
        assert w.close() == 0
    return built, found


@needs_env
def test_build_and_search_are_reproducible(tmp_path: Path, stub: Stub) -> None:
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
    first_chat, first_emb = list(stub.chat), list(stub.embeddings)
    assert len(first_chat) == 8 and len(first_emb) > 0
    assert b"Today's date is 2023-05-08" in first_chat[0]

    # A rerun in a fresh process over the same store: the same bodies, byte for byte, and the
    # same memory ids (clock frozen, ids seeded, the store wiped first).
    stub.chat.clear()
    stub.embeddings.clear()
    built2, found2 = _run(tmp_path, stub, "b", store)
    assert stub.chat == first_chat and stub.embeddings == first_emb
    assert built2["memories"] == mems and found2 == found


@needs_env
def test_unparseable_facts_are_counted_as_drops(tmp_path: Path) -> None:
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if any('"facts"' in str(m.get("content")) for m in body["messages"]):
            return {"content": "not json"}
        return scripted_reply(body)

    s = Stub(broken)
    try:
        built, _ = _run(tmp_path, s, "bad", tmp_path / "store", search=False)
    finally:
        s.close()
    assert built["op"] == "built", built
    assert built["memories"] == [] and built["dropped"] == 4
    assert built["drops"][0] == {"where": "facts", "why": "reply not parsed"}
    assert len(s.chat) == 4  # no update call follows a lost facts reply


@needs_env
def test_graph_mode_adds_relations(tmp_path: Path, stub: Stub) -> None:
    assert GRAPH_SPEC.options == {"graph": True} and GRAPH_SPEC.env_name == "mem0"
    built, found = _run(tmp_path, stub, "g", tmp_path / "store", graph=True)
    assert built["op"] == "built" and built["dropped"] == 0, built
    kinds = {m["kind"] for m in built["memories"]}
    assert kinds == {"memory", "relation"}
    assert found is not None and found["op"] == "found", found
    assert {h["kind"] for h in found["results"]["conv-t:q0"]} == {"memory", "relation"}
    tools = [json.loads(b)["tools"][0]["function"]["name"] for b in stub.chat
             if b"\"tools\"" in b]
    assert {"extract_entities", "establish_relationships", "delete_graph_memory"} <= set(tools)


@needs_env
def test_one_worker_serves_several_units_and_survives_a_bad_request(tmp_path: Path,
                                                                     stub: Stub) -> None:
    """Each unit's stores are closed after use (qdrant's local mode locks its folder, and
    mem0 reopens MEM0_DIR/migrations_qdrant for every Memory); a failed request is one error
    reply with the log's tail, and the worker goes on."""
    w = Worker(tmp_path, "multi")
    try:
        hello = {"op": "hello", "system": "mem0", "clock": CLOCK, "settings": {}}
        assert w.call(hello)["op"] == "ready"
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
    finally:
        assert w.close() == 0


@needs_env
def test_graph_tool_arguments_not_json_drop_the_batch_not_the_unit(tmp_path: Path) -> None:
    """mem0 raises on tool arguments that are not JSON (its vector half has stored the batch's
    memories by then); the worker retries (add.py) and then counts one "add" drop per batch."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        if "establish_relationships" in json.dumps(body.get("tools") or []):
            reply["tool_calls"][0]["function"]["arguments"] = "{not json"
        return reply

    s = Stub(broken)
    try:
        built, _ = _run(tmp_path, s, "badg", tmp_path / "store", graph=True, search=False,
                        add_attempts=1)
    finally:
        s.close()
    assert built["op"] == "built", built
    assert built["dropped"] == 4 and {d["where"] for d in built["drops"]} == {"add"}
    assert {m["kind"] for m in built["memories"]} == {"memory"}


# --- worker_common, with our own Python (no mem0 environment needed) ------------------------

def _common(code: str) -> subprocess.CompletedProcess[str]:
    head = f"import sys; sys.path.insert(0, {str(WORKERS_DIR)!r}); import worker_common as wc\n"
    return subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True,
                          timeout=60, check=False)


def test_refuse_network_blocks_other_hosts_and_allows_loopback(stub: Stub) -> None:
    port = stub.server.server_address[1]
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
