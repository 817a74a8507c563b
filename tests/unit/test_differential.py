"""`jobs/report.py differential` (structmem_gpu/analysis/differential*.py): two synthetic run
directories sharing one cache dir — an "official" run whose extraction went through the
recording front (FrontCache bodies, sha256 hashes) and whose answers are ours (LLM cache), and
a "port" run of our stages (LLM cache, messages hashes) — aligned per stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from jobs.report import main as report_main
from structmem_gpu.analysis import differential as D
from structmem_gpu.analysis.differential_memory import overlap_means
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.schemas import REQUESTS, TABLES, frame
from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from structmem_gpu.systems.front import FrontCache, body_hash, body_key

SYSTEM = "Extract the facts of these turns.\nOne fact per line.\nKeep the speaker's name."
TURNS = {  # the user message of each extraction request
    "e1": "Turn 1: Alice went to Paris.\nTurn 2: Bob painted a wall.",
    "e2": "Turn 1: Alice went to Paris.\nTurn 2: Bob stayed home.\nTurn 3: Carol called.",
    "e3": "Turn 1: Dan bought a bike.",
    "e4": "Turn 9: Something only the port extracted, nothing like the others at all.",
}
PORT_E2 = TURNS["e2"].replace("Bob stayed home.", "Bob stayed at home.")


def _messages(user: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _our_requests(cache_dir: Path, stage: str, items: list[tuple[str, str, str]]
                  ) -> list[dict[str, Any]]:
    """Send (request_id, conv_id, user text) through the scripted LLM and the response cache
    (as a stage does); their requests rows."""
    reqs = [LLMRequest(request_id=rid, stage=stage, prompt_version=f"{stage}/1", conv_id=conv,
                       messages=tuple(Message(**m) for m in _messages(user)),
                       sampling=Sampling(max_tokens=64))
            for rid, conv, user in items]
    cache = ResponseCache(cache_dir / "llm")
    results = CachedBackend(ScriptedLLM(), cache).generate(reqs)
    cache.close()
    return [{"request_id": r.request_id, "stage": stage, "conv_id": q.conv_id,
             "model": "scripted", "prompt_version": q.prompt_version,
             "messages_hash": r.messages_hash, "cache_hit": r.cache_hit}
            for q, r in zip(reqs, results, strict=True)]


def _system_rows(cache_dir: Path, items: list[tuple[str, str, str | None, bool]]
                 ) -> list[dict[str, Any]]:
    """Front rows of (phase, conv_id, user text, stored?) chat calls of lightmem_official;
    a None text is an embedding call (its body is not kept, as the front does)."""
    front = FrontCache(cache_dir / "llm" / "system_responses.seg")
    rows = []
    for seq, (phase, conv, user, stored) in enumerate(items):
        kind = "embeddings" if user is None else "chat"
        body: dict[str, Any] = ({"model": "encoder", "input": ["x"]} if user is None else
                                {"model": "gpt-4o-mini", "messages": _messages(user),
                                 "temperature": 0, "max_tokens": 16000,
                                 "response_format": {"type": "json_object"}})
        if stored and user is not None:
            front.put(body_key("scripted", body), {"choices": []}, body)
        rows.append({"request_id": f"system_build:lightmem_official:{phase}:{conv}:{seq}",
                     "stage": "system_build", "conv_id": conv, "model": "scripted",
                     "prompt_version": f"lightmem_official/{kind}",
                     "messages_hash": body_hash(body), "cache_hit": False})
    front.close()
    return rows


def _run(root: Path, cache_dir: Path, stages: list[str], requests: list[dict[str, Any]],
         tables: dict[str, list[dict[str, Any]]]) -> Path:
    run = RunDir(root)
    run.write_table("requests", frame(requests, REQUESTS))
    for name, rows in tables.items():
        run.write_table(name, frame(rows, TABLES[name]))
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text(json.dumps(
        {"paths": {"cache_dir": str(cache_dir)}, "method": {"stages": stages}}))
    return root


def _ret(qid: str, conv: str, circuit: str, items: list[str]) -> list[dict[str, Any]]:
    return [{"question_id": qid, "conv_id": conv, "circuit": circuit, "rank": r, "item_id": i,
             "score": 1.0 - r / 10} for r, i in enumerate(items)]


TEXT = {"a": "Alice went to Paris.", "b": "Bob painted a wall.", "c": "Carol called.",
        "d": "Dan bought a bike.", "x": "Something else.", "y": "Yet another.", "s": "A synthesis."}


@pytest.fixture()
def runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    cache = tmp_path / "cache"
    official_requests = _system_rows(cache, [
        ("build.extract", "conv-1", TURNS["e1"], True),
        ("build.extract", "conv-1", TURNS["e2"], True),
        ("build.extract", "conv-2", TURNS["e3"], True),
        ("build.extract", "conv-2", "never answered", False),  # no body kept: unknown content
        ("search.retrieve", "conv-1", None, False),  # embedding calls: counted, not diffed
        ("search.retrieve", "conv-2", None, False),
        ("build", "conv-1", "a plain build phase", True),
    ]) + _our_requests(cache, "answer", [("answer:q1", "conv-1", "Where did Alice go?"),
                                         ("answer:q2", "conv-2", "What did Dan buy?")])
    port_requests = _our_requests(cache, "extract", [
        ("extract:1", "conv-1", TURNS["e1"]), ("extract:2", "conv-1", TURNS["e4"]),
        ("extract:3", "conv-1", PORT_E2), ("extract:4", "conv-2", TURNS["e3"]),
    ]) + _our_requests(cache, "answer", [("answer:q1", "conv-1", "Where did Alice go?"),
                                         ("answer:q2", "conv-2", "What did Dan buy?")]
    ) + _our_requests(cache, "judge", [("judge:q1", "conv-1", "Is Paris right?")])
    memories = [{"conv_id": c, "memory_id": m, "owner": None, "text": TEXT[t], "created_at": None,
                 "metadata": None} for c, m, t in
                [("conv-1", "m1", "a"), ("conv-1", "m2", "b"), ("conv-1", "m3", "c"),
                 ("conv-2", "m4", "d")]]
    official = _run(tmp_path / "lightmem_official", cache,
                    ["load", "system_build", "system_search", "answer", "judge", "report"],
                    official_requests,
                    {"memories": memories,
                     "retrievals": _ret("q1", "conv-1", "system", ["m1", "m2", "m3"])
                     + _ret("q2", "conv-2", "system", ["m4"])})
    entries = [{"entry_id": e, "conv_id": c, "text": " " + TEXT[t] + " "} for c, e, t in
               [("conv-1", "e1", "a"), ("conv-1", "e2", "b"), ("conv-1", "e9", "x"),
                ("conv-1", "e8", "y"), ("conv-2", "e4", "d"), ("conv-2", "e5", "y")]]
    port = _run(tmp_path / "port", cache,
                ["load", "compress", "extract", "embed", "consolidate", "update", "retrieve",
                 "answer", "judge", "report"], port_requests,
                {"entries": entries,
                 "syntheses": [{"synth_id": "s1", "conv_id": "conv-1", "text": TEXT["s"]}],
                 "entry_updates": [{"entry_id": "e9", "conv_id": "conv-1", "decision": "delete"},
                                   {"entry_id": "e8", "conv_id": "conv-1", "decision": "ignore"}],
                 "retrievals": _ret("q1", "conv-1", "entries", ["e1", "e2", "e9"])
                 + _ret("q1", "conv-1", "syntheses", ["s1"])
                 + _ret("q2", "conv-2", "entries", ["e4", "e5"])
                 + _ret("q3", "conv-2", "entries", ["e4"])})
    return official, port, cache


def test_stages_counts_shares_and_identity_across_hash_schemes(runs) -> None:
    official, port, _cache = runs
    d = D.differential(official, port, k=3)  # cache dir read from the saved configs
    assert [s.stage for s in d.stages] == ["extract", "retrieve", "answer", "judge", "build"]
    ex = d.stage("extract")
    assert (ex.official, ex.port, ex.identical) == (4, 4, 2)
    assert ex.share == 0.5
    assert len(ex.official_unknown) == 1 and ex.official_unknown[0].request_id.endswith(":3")
    # e1 and e3: the front's body sha256 and our messages hash name the same messages
    off_hashes = {r.request_id.rsplit(":", 1)[1]: r.messages_hash for r in
                  [p.official for p in ex.pairs]}
    assert len(ex.pairs) == 1 and list(off_hashes) == ["1"]
    pair = ex.pairs[0]
    assert pair.port.request_id == "extract:3"  # the most similar, not the port-only extract:2
    assert pair.ratio == pytest.approx(2 * 7 / 16)  # 7 of 8 rendered lines each side agree
    assert ex.differing == [(pair.official.messages_hash, pair.port.messages_hash)]
    assert len(pair.official.messages_hash) == 64 and len(pair.port.messages_hash) == 32
    assert [r.request_id for r in ex.unmatched_port] == ["extract:2"] and not ex.unmatched_official
    # what identity leaves out is listed apart
    assert ex.official_params == {'max_tokens=16000 model=scripted response_format=json_object '
                                  'temperature=0': 3}  # the unknown request's are unknown
    assert ex.port_params == {"max_tokens=64 model=scripted seed=0 temperature=0 top_p=1": 4}
    ans = d.stage("answer")
    assert (ans.official, ans.port, ans.identical, ans.share, ans.first) == (2, 2, 2, 1.0, None)
    ret = d.stage("retrieve")
    assert (ret.official, ret.port, ret.official_embeddings) == (0, 0, 2)
    assert ret.embeddings_identical is None  # the front keeps no embedding bodies
    judge = d.stage("judge")
    assert (judge.official, judge.port, judge.identical, judge.share) == (0, 1, 0, 0.0)
    assert judge.first is not None and judge.first.pair.official is None
    assert (d.stage("build").official, d.stage("build").port) == (1, 0)


def test_first_difference_diff_shows_the_changed_line(runs, monkeypatch) -> None:
    official, port, cache = runs
    ex = D.differential(official, port, cache).stage("extract")
    diff = ex.first.diff.splitlines()
    assert diff[0].startswith("--- official system_build:lightmem_official:build.extract:conv-1:1")
    assert diff[1] == "+++ port extract:3"
    assert [x for x in diff if x[:1] in "+-" and x[:3] not in ("---", "+++")] == [
        "-Turn 2: Bob stayed home.", "+Turn 2: Bob stayed at home."]
    assert ex.first.cut_lines == 0
    monkeypatch.setattr(D, "DIFF_LINES", 4)
    cut = D.differential(official, port, cache).stage("extract").first
    assert (cut.total_lines, cut.cut_lines) == (len(diff), len(diff) - 4)
    assert cut.diff.splitlines() == diff[:4]


def test_memory_sizes_and_overlap_at_k(runs) -> None:
    official, port, cache = runs
    d = D.differential(official, port, cache, k=3)
    mem = {r["conv_id"]: r for r in d.memory.iter_rows(named=True)}
    assert (mem["conv-1"]["official_memories"], mem["conv-1"]["port_entries"],
            mem["conv-1"]["port_entries_deleted"], mem["conv-1"]["port_syntheses"]) == (3, 4, 1, 1)
    assert (mem["conv-2"]["official_memories"], mem["conv-2"]["port_entries"],
            mem["conv-2"]["port_entries_deleted"], mem["conv-2"]["port_syntheses"]) == (1, 2, 0, 0)
    assert "official_entries" not in d.memory.columns  # a table the run lacks: no column
    q = {(r["question_id"], r["port_circuit"]): r for r in d.questions.iter_rows(named=True)}
    assert set(q) == {("q1", "entries"), ("q1", "syntheses"), ("q2", "entries")}  # q3: port only
    assert q["q1", "entries"]["shared"] == 2
    assert q["q1", "entries"]["overlap"] == pytest.approx(2 / 3)
    assert q["q2", "entries"]["overlap"] == 0.5 and q["q1", "syntheses"]["overlap"] == 0.0
    means = {r["port_circuit"]: r["mean_overlap"]
             for r in overlap_means(d.questions).iter_rows(named=True)}
    assert means == {"entries": pytest.approx((2 / 3 + 0.5) / 2), "syntheses": 0.0}
    top2 = D.differential(official, port, cache, k=2).questions
    assert top2.filter(pl.col("question_id") == "q1", pl.col("port_circuit") == "entries")[
        "overlap"].to_list() == [1.0]


def test_cli_writes_the_table_and_frames(runs, capsys) -> None:
    official, port, _cache = runs
    assert report_main(["differential", str(official), str(port), "--k", "3"]) == 0
    out_dir = port / "differential" / "lightmem_official"
    md = (out_dir / "differential.md").read_text()
    assert md == capsys.readouterr().out.split("written: ")[0]
    assert ("| extract | 4 | 4 | 2 | 0.500 | `system_build:lightmem_official:build.extract:"
            "conv-1:1` ↔ `extract:3` (similarity 0.875) |") in md
    assert "| answer | 2 | 2 | 2 | 1.000 | none |" in md
    assert "| judge | 0 | 1 | 0 | 0.000 | only in port: `judge:q1` |" in md
    assert "-Turn 2: Bob stayed home.\n+Turn 2: Bob stayed at home." in md
    assert "| system | entries | 2 | 0.583 |" in md
    stages = pl.read_parquet(out_dir / "differential.parquet")
    assert stages["stage"].to_list() == ["extract", "retrieve", "answer", "judge", "build"]
    assert stages.filter(pl.col("stage") == "extract").select(
        "official", "port", "identical", "share", "official_unknown", "differing", "port_only"
    ).row(0) == (4, 4, 2, 0.5, 1, 1, 1)
    assert pl.read_parquet(out_dir / "differential_questions.parquet").height == 3


def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys) -> None:
    official, port, cache = runs
    bare = tmp_path / "not_a_run"
    bare.mkdir()
    out = tmp_path / "out"
    assert report_main(["differential", str(bare), str(port), "--out", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert err == [(f"error: {bare / '.hydra' / 'config.yaml'}: missing, so paths.cache_dir is "
                    "unknown: pass --cache-dir DIR")]
    assert report_main(["differential", str(bare), str(port), "--cache-dir", str(cache),
                        "--out", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    missing = bare / "tables" / "requests.parquet"
    assert len(err) == 1 and err[0].startswith(f"error: {missing}: missing")
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    assert report_main(["differential", str(official), str(port), "--cache-dir", str(empty),
                        "--out", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and str(empty / "llm" / "system_responses.seg") in err[0]
    assert not out.exists() and not empty.joinpath("llm").exists()  # nothing created


def test_a_run_that_sent_no_seed_lists_none(runs) -> None:
    """The cache stores each request's sampling seed; a run with llm.request_seed=false sent
    none on the wire, so its settings list none (the judge's own llm decides for the judge)."""
    official, port, cache = runs
    saved = port / ".hydra" / "config.yaml"
    cfg = json.loads(saved.read_text())
    saved.write_text(json.dumps({**cfg, "llm": {"request_seed": False}}))
    d = D.differential(official, port, cache)
    assert d.stage("extract").port_params == {"max_tokens=64 model=scripted temperature=0 top_p=1": 4}
    assert "seed=0" in next(iter(d.stage("judge").port_params))  # judge.llm still seeds
    saved.write_text(json.dumps({**cfg, "judge": {"llm": {"request_seed": False}}}))
    d = D.differential(official, port, cache)
    assert "seed=0" not in next(iter(d.stage("judge").port_params))
    assert "seed=0" in next(iter(d.stage("extract").port_params))
