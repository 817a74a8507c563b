"""The MemoryOS worker (structmem_gpu/systems/workers/memoryos_worker.py) run from its own
environment against our recording front with MemoryOS's scripted replies: a build pairs the
turns into pages and moves each through short-term into mid-term memory, a hot segment into the
long-term persona memory; a search in another worker process reads the store back and returns
what MemoryOS's answer prompt would show; a rebuild sends the same chat bodies and stores the
same memories (the wall clock frozen); MemoryOS's hard-coded client never leaves the machine;
replies MemoryOS cannot use are counted as dropped while the conversation completes.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/memoryos/bin/python and the
exported code in <dir>/memoryos/src (`python jobs/data.py systems install memoryos`,
STRUCTMEM_OFFICIAL_DIR pointing at the official checkouts)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems import envs
from structmem_gpu.systems.memoryos import SPEC, USER_DATA, scripted_reply
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
    system_python,
    systems_dir,
)

needs_memoryos = needs_env("memoryos")
pytestmark = [pytest.mark.systems_heavy]

CLOCK = "2025-01-01T00:00:00"
TURNS = [
    *CONVERSATION,
    ("Caroline", "I want to become a counselor for transgender youth."),
    ("Melanie", "You would be great at counseling, Caroline."),
]
TURNS_2 = [
    ("Caroline", "Thanks! I also started pottery classes on Fridays."),
    ("Melanie", "Pottery is relaxing. Here is the bowl I made [image: a blue ceramic bowl]"),
    ("Caroline", "My friends threw me a birthday party at the beach."),
    ("Melanie", "The beach is lovely this time of year. We went camping there."),
    ("Caroline", "Camping sounds fun! Did the kids enjoy the campfire?"),
    ("Melanie", "They loved roasting marshmallows by the campfire."),
    ("Caroline", "I am reading a book about adoption stories."),
    ("Melanie", "That book sounds moving, tell me more about it later."),
    ("Caroline", "I will, see you soon!"),  # no reply after it: a page MemoryOS never stores
]
SESSIONS = [session(1, "2023-05-08T13:56:00", TURNS, prefix="t"),
            session(2, "2023-05-25T09:10:00", TURNS_2, prefix="t")]
PAGES = 8  # speaker_a turn + the speaker_b turn after it
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "What did Melanie paint?"},
             {"question_id": f"{UNIT}:q1", "question": "What is Caroline researching?"}]


def _worker(tmp: Path, name: str, clock: str = CLOCK) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=clock, settings={"top_k": 10})


def _hashes(rows: Any, kind: str) -> list[str]:
    return hashes(rows, "memoryos", kind)


def _kinds(memories: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for m in memories:
        out.setdefault(m["metadata"]["kind"], []).append(m)
    return out


def _build_once(tmp: Path, name: str, reply: Reply, **settings: Any) -> dict[str, Any]:
    with _worker(tmp, name) as worker:
        assert worker.hello(**settings)["op"] == "ready"
        with front(reply) as f:
            built = worker.ask(request(SPEC, "build", f, tmp / f"store_{name}", sessions=SESSIONS))
    return built


@needs_memoryos
def test_build_search_in_another_process_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "s1"
    with _worker(tmp_path, "1") as w1:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "1d71706"
        with front(SPEC) as f:
            built = w1.ask(request(SPEC, "build", f, store, sessions=SESSIONS))
            rows1 = f.take_rows("system_build")
            bodies = [json.loads(b) for b in f.chat_bodies]
            rebuilt = w1.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
            rows2 = f.take_rows("system_build")

    assert built["dropped"] == 0, built["drops"]
    assert built["pages"] == PAGES and built["unpaired"] == 1 and built["segments"] == 1
    kinds = _kinds(built["memories"])
    pages = kinds["page"]
    assert pages[0]["text"].startswith(f"Caroline: {TURNS[0][1]}\nMelanie: {TURNS[1][1]}")
    assert "Conversation chain overview: " in pages[0]["text"]  # the meta-summary call's
    # the caption back in LoCoMo's field, formatted by MemoryOS's driver
    assert "Here is the bowl I made (image description: a blue ceramic bowl)" in pages[4]["text"]
    assert [p["created_at"] for p in pages] == ["2023-05-08T13:56:00"] * 4 + ["2023-05-25T09:10:00"] * 4
    assert pages[0]["metadata"]["timestamp"] == "1:56 pm on 8 May, 2023"  # LoCoMo's own text
    # a page the continuity call found continuous is chained to the one before it
    chained = [(p, q) for p, q in itertools.pairwise(pages) if q["metadata"]["pre_page"]]
    assert chained and all(q["metadata"]["pre_page"] == p["memory_id"] for p, q in chained)
    # the segment grew hot (7 pages: heat 5.6 >= 5): the persona memory was written
    assert len(kinds["profile"]) == 1 and kinds["profile"][0]["owner"] == "Caroline"
    assert kinds["knowledge"] and {m["owner"] for m in kinds["knowledge"]} == {"Caroline"}
    assert kinds["assistant_knowledge"][0]["owner"] == "Melanie"
    # MemoryOS's wall-clock stamps are the frozen clock
    assert {m["metadata"]["timestamp"] for m in kinds["knowledge"]} == {"2025-01-01 00:00:00"}
    mid = json.loads((store / "mid_term.json").read_text())
    assert [s["timestamp"] for s in mid["sessions"].values()] == ["2025-01-01 00:00:00"]
    # per page: a continuity check (all but the first), a meta-summary and a topic summary;
    # one new segment (its summary's keywords, its page's); the persona analysis (2 calls)
    chat = _hashes(rows1, "chat")
    assert len(chat) == (PAGES - 1) + PAGES + PAGES + 2 + 2
    assert rows1["error"].null_count() == rows1.height
    # every request is one of MemoryOS's prompts the scripted replies know by its role
    assert all(scripted_reply(b)["content"] != "Not mentioned in the conversation" for b in bodies)
    assert {b["model"] for b in bodies} == {"gpt-4o-mini"}  # as MemoryOS sends it
    # a rebuild into a fresh store: the same bodies in the same order, the same memories
    assert _hashes(rows2, "chat") == chat
    assert rebuilt["memories"] == built["memories"]
    assert {p.name for p in store.iterdir()} == {
        "short_term.json", "mid_term.json", "long_term.json", "unit.json"}

    with _worker(tmp_path, "2") as w2:  # the store, read back
        assert w2.hello()["op"] == "ready"
        with front(SPEC) as f:
            found = w2.ask(request(SPEC, "search", f, store, questions=QUESTIONS, k=3))
            rows_s = f.take_rows("system_search")
    ids = {m["memory_id"]: m for m in built["memories"]}
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        passages = [h for h in hits if h["kind"] == "passage"]
        assert 0 < len(passages) <= 3  # k pages (the driver's queue_capacity)
        assert all(h["memory_id"] in ids and isinstance(h["score"], float) for h in passages)
        assert [h["score"] for h in passages] == sorted((h["score"] for h in passages),
                                                        reverse=True)
        assert passages[0]["text"] == ids[passages[0]["memory_id"]]["text"]
        profile = [h for h in hits if h["kind"] == "context"]
        assert len(profile) == 1 and profile[0]["text"].startswith("User profile of Caroline:")
        facts = [h for h in hits if h["kind"] == "memory" and h["owner"] == "Caroline"]
        # the driver's renaming: "User" is speaker_a in the answer prompt
        assert facts and all(h["text"].startswith("Caroline said: ") for h in facts)
        assistant = [h for h in hits if h["kind"] == "memory" and h["owner"] == "Melanie"]
        assert assistant and "Melanie painted" in assistant[0]["text"]  # "I" -> speaker_b
    # per question: the keyword call; embeddings: the questions and each page once (texts
    # embedded once are remembered for the unit)
    assert len(_hashes(rows_s, "chat")) == len(QUESTIONS)
    assert len(_hashes(rows_s, "embeddings")) >= len(QUESTIONS)
    logs = w1.log_text() + w2.log_text()
    assert "network refused" not in logs  # MemoryOS's hard-coded base URL was never dialled


OPENER = ("Melanie", "Hi Caroline! How was your week?")


@needs_memoryos
def test_pages_pair_by_speaker_a_when_speaker_b_speaks_first(tmp_path: Path) -> None:
    """LoCoMo's conv-30 shape: speaker_b (here Melanie) opens the conversation. With the
    payload's speaker_a / speaker_b, pages are a Caroline turn and Melanie's reply after it
    (the opener has no speaker_a turn before it: unpaired, as MemoryOS's driver leaves it);
    without them, speaker_a is whoever speaks first."""
    sessions = [session(1, "2023-05-08T13:56:00", [OPENER, *TURNS], prefix="t"), SESSIONS[1]]
    first_seen = ["Melanie", "Caroline"]
    with _worker(tmp_path, "roles") as worker:
        assert worker.hello()["op"] == "ready"
        with front(SPEC) as f:
            named = worker.ask(request(SPEC, "build", f, tmp_path / "named", sessions=sessions,
                                       speakers=first_seen, speaker_a="Caroline",
                                       speaker_b="Melanie"))
            fallback = worker.ask(request(SPEC, "build", f, tmp_path / "fallback",
                                          sessions=sessions, speakers=first_seen))
    assert named["pages"] == PAGES and named["unpaired"] == 2  # the opener, the last turn
    pages = _kinds(named["memories"])["page"]
    assert pages[0]["text"].startswith(f"Caroline: {TURNS[0][1]}\nMelanie: {TURNS[1][1]}")
    assert _kinds(named["memories"])["profile"][0]["owner"] == "Caroline"
    assert json.loads((tmp_path / "named" / "unit.json").read_text())["speakers"] == [
        "Caroline", "Melanie"]
    # no roles in the payload: the first to speak is speaker_a
    pages = _kinds(fallback["memories"])["page"]
    assert pages[0]["text"].startswith(f"Melanie: {OPENER[1]}\nCaroline: {TURNS[0][1]}")


# In the environment's Python: each payload through the worker's LoCoMo record and MemoryOS's
# own driver's pairing (main_loco_parse.process_conversation), no LLM call.
PAIRING = """
import json, os, sys
sys.path.insert(0, os.environ["WORKER_DIR"])
import memoryos_worker as w
w._install_stand_ins()
sys.path.insert(0, os.path.join(os.environ["STRUCTMEM_SYSTEM_SRC"], "eval"))
import main_loco_parse
out = {}
for unit, p in json.load(sys.stdin).items():
    conv, _ = w._conversation(p["sessions"], [p["speaker_a"], p["speaker_b"]])
    out[unit] = main_loco_parse.process_conversation(conv)
json.dump(out, sys.stdout)
"""


@needs_memoryos
@pytest.mark.locomo
def test_pages_pair_by_speaker_a_on_every_real_locomo_conversation(
        tmp_path: Path, locomo_path: Path) -> None:
    """The real file's 10 conversations, as the build stage sends them (load stage, payloads):
    every page MemoryOS's driver makes opens with a speaker_a turn and carries a speaker_b
    reply, on the six conversations whose speaker_b speaks first too (there the opener alone
    is a page without a speaker_a half, which the driver never stores)."""
    from structmem_gpu.core.artifacts import RunDir
    from structmem_gpu.systems.stages import build_payloads
    from tests.fixtures.pipeline import run_pipeline

    run_dir = tmp_path / "run"
    run_pipeline(["benchmark=locomo", f"benchmark.path={locomo_path}", "stages=[load]",
                  f"paths.cache_dir={tmp_path / 'cache'}"], run_dir)
    run = RunDir(run_dir)
    payloads = build_payloads(run.read_table("turns"), run.read_table("conversations"))
    assert len(payloads) == 10
    env = {**os.environ, "WORKER_DIR": str(SPEC.worker_path.parent),
           "STRUCTMEM_SYSTEM_SRC": str(envs.source_dir(SPEC, systems_dir()))}
    proc = subprocess.run([str(system_python(SPEC)), "-c", PAIRING], input=json.dumps(payloads),
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = json.loads(proc.stdout)
    b_first = set()
    for unit, p in payloads.items():
        said = {who: set() for who in (p["speaker_a"], p["speaker_b"])}
        for s in p["sessions"]:
            for t in s["turns"]:
                said[t["speaker"]].add(t.get("raw_text") or t["text"])
        a_turns = sum(t["speaker"] == p["speaker_a"] for s in p["sessions"] for t in s["turns"])
        opener = [d for d in pages[unit] if not d["user_input"]]
        if opener:
            b_first.add(unit)
        assert len(opener) <= 1 and len(pages[unit]) == a_turns + len(opener), unit
        for d in pages[unit]:
            user = d["user_input"].split(" (image description: ")[0]
            reply = d["agent_response"].split(" (image description: ")[0]
            assert not user or user in said[p["speaker_a"]], (unit, d)
            assert not reply or reply in said[p["speaker_b"]], (unit, d)
    assert b_first == {"conv-30", "conv-41", "conv-42", "conv-43", "conv-47", "conv-49"}


def _not_json(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": "I am not sure what you mean."}


def _wrong_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps({"items": [{"x": 1}]})}


@needs_memoryos
def test_garbled_replies_are_counted_and_the_unit_completes(tmp_path: Path) -> None:
    # prose: no topic summary parses, so no evicted page is ever stored
    built = _build_once(tmp_path, "prose", _not_json)
    assert built["pages"] == 0 and built["dropped"] == PAGES
    assert {d["where"] for d in built["drops"]} == {"summary"}

    # a JSON object where MemoryOS expects an array of themes: its eviction raises (the
    # driver would stop); each page is lost, counted, and the conversation completes
    built = _build_once(tmp_path, "keys", _wrong_keys)
    assert built["pages"] == 0 and built["dropped"] == PAGES
    assert {d["where"] for d in built["drops"]} == {"evict"}


@needs_memoryos
def test_a_persona_reply_it_cannot_split_is_counted(tmp_path: Path) -> None:
    """Two user-data sections make MemoryOS's persona parser raise: the persona is not
    updated (counted once per hot-segment check that fails), the pages are all kept."""
    def twice(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        if USER_DATA in reply["content"]:
            reply["content"] += f"\n{USER_DATA}\n- again"
        return reply

    built = _build_once(tmp_path, "persona", twice)
    kinds = _kinds(built["memories"])
    assert built["pages"] == PAGES and "knowledge" not in kinds and "profile" not in kinds
    assert built["drops"] and {d["where"] for d in built["drops"]} == {"profile"}


@needs_memoryos
def test_a_failed_call_to_the_front_fails_the_unit(tmp_path: Path) -> None:
    """A call the front could not answer fails the conversation (an error reply), and the
    worker serves the next one."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if "analyzing dialogue topics" in json.dumps(body.get("messages")):
            raise RuntimeError("the model server is gone")
        return scripted_reply(body)

    with _worker(tmp_path, "broken") as worker:
        assert worker.hello()["op"] == "ready"
        with front(broken) as f:
            bad = worker.call(request(SPEC, "build", f, tmp_path / "s1", sessions=SESSIONS))
        assert bad["op"] == "error" and "InternalServerError" in bad["error"], bad
        with front(SPEC) as f:
            good = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
        assert good["pages"] == PAGES


@needs_memoryos
def test_another_clock_changes_only_the_stamps(tmp_path: Path) -> None:
    """system.clock is what MemoryOS's wall-clock stamps say (a worker with another clock
    stores other stamps; the requests do not carry them)."""
    with _worker(tmp_path, "later", clock="2026-03-04T05:06:07") as worker:
        assert worker.hello()["op"] == "ready"
        with front(SPEC) as f:
            built = worker.ask(request(SPEC, "build", f, tmp_path / "s", sessions=SESSIONS))
    knowledge = _kinds(built["memories"])["knowledge"]
    assert {m["metadata"]["timestamp"] for m in knowledge} == {"2026-03-04 05:06:07"}


def _body(system: str, user: str) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 2000,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}


def test_scripted_reply_tells_memoryos_requests_by_their_role() -> None:
    said = "User: I painted a lake sunrise\nAssistant: Lovely\n"
    themes = json.loads(scripted_reply(_body(
        "You are an expert in analyzing dialogue topics.",
        f"...\nConversation content:\n{said}"))["content"])
    assert themes[0]["keywords"] == ["daily life", "painted", "lake"]
    keywords = scripted_reply(_body("You are a keyword extraction expert.",
                                    "Extract, at most three:\nUser: lake sunrise"))["content"]
    assert keywords == "daily life, lake, sunrise"
    same = scripted_reply(_body("You are a conversation continuity detector.",
                                "Previous Page:\nUser: the lake\nCurrent Page:\nUser: a lake "
                                "walk\nContinuous?"))["content"]
    other = scripted_reply(_body("You are a conversation continuity detector.",
                                 "Previous Page:\nUser: the lake\nCurrent Page:\nUser: pottery "
                                 "class\nContinuous?"))["content"]
    assert (same, other) == ("true", "false")
    persona = scripted_reply(_body("You are a personality and user data analysis engine.",
                                   f"Conversation:\n{said}"))["content"]
    assert persona.split(USER_DATA)[1].strip() == "- User said: I painted a lake sunrise"
    assistant = scripted_reply(_body("You are an assistant knowledge extraction engine.",
                                     "1. User: x\n   AI: an example\nConversation:\nUser: hi\n"
                                     "AI: I paint lakes\n"))["content"]
    assert assistant.endswith("- I said: I paint lakes")
    merged = scripted_reply(_body("You are a profile integration system.",
                                  "## Current Profile\nold\n\n## New Data\nnew\n\n## Rules\n"))
    assert merged["content"] == "new"
    assert scripted_reply(_body("You are role-playing as Melanie.", "the question is: x"))[
        "content"] == "Not mentioned in the conversation"
