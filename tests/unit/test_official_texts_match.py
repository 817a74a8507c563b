"""With the official checkouts present, our filled prompts, messages and roles equal what the
official code sends for the same inputs: the 9 paper-protocol judge prompts (the LoCoMo judge
from LightMem and from mem0, LongMemEval's 6 question types and abstention) and the LightMem
readers (StructMem, flat), read from a git repository as given (bare mirrors too), from a git
work tree and from a plain directory of the same commit.

The official functions are taken from the checkout with `ast` and executed here, in the test
only, in a namespace holding a recording stand-in for the OpenAI client. The checkouts come
from one folder, STRUCTMEM_OFFICIAL_DIR, holding bare repositories `lightmem.git` (read at
8fc9a91), `mem0.git` (b3ede5b, a commit before 9315e30) and `longmemeval.git` (9e0b455), as
../shared/official does (.ci/run sets it, so CI runs these tests); unset: skipped, set but
incomplete: failed. Besides the three variants of each checkout, one variant is a copy owned
by another user and read-only (a lab's shared checkout): git refuses it for "dubious
ownership" unless called with `-c safe.directory`. Nothing of them is stored in this
repository.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
import subprocess
import typing
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core import schemas
from structmem_gpu.eval.answer import AnswerInputs
from structmem_gpu.eval.judge import JudgeItem, build_request, official_judges, read_label
from structmem_gpu.llm.types import Sampling
from structmem_gpu.methods.structmem.context import official_prompts
from structmem_gpu.prompts import official
from structmem_gpu.prompts import sources as S
from structmem_gpu.prompts.pinned import PINNED
from tests.fixtures.pipeline import job_with

ENV = "STRUCTMEM_OFFICIAL_DIR"
# Each reference: its bare repository in STRUCTMEM_OFFICIAL_DIR and the commit read.
OFFICIAL = {name: (pin.folder, pin.commit[:7]) for name, pin in PINNED.items()}
# The files each test reads (the work-tree copies hold only these).
FILES = {
    "lightmem": ["experiments/locomo", "src/lightmem/memory/prompts.py"],
    "mem0": ["evaluation/metrics/llm_judge.py"],
    "longmemeval": ["src/evaluation/evaluate_qa.py"],
}


def _spec(name: str) -> str:
    root = os.environ.get(ENV)
    if not root:
        pytest.skip(f"{ENV} not set: no official checkouts to compare with")
    folder, commit = OFFICIAL[name]
    path = Path(root).expanduser() / folder
    assert path.is_dir(), f"{ENV}={root}: {folder} is missing (expected a bare {name} repository)"
    return f"{path}@{commit}"


def _git(*args: str) -> str:
    # the test's own reads trust any owner (the foreign-owner variant is a copy we made)
    return subprocess.run(["git", "-c", "safe.directory=*", *args], check=True,
                          capture_output=True, text=True).stdout


def _foreign_copy(path: Path, dest: Path) -> Path:
    """A read-only copy of `path` owned by another user (nobody, uid 65534): what git calls
    dubious ownership. Needs root to chown (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("a copy owned by another user needs root (chown)")
    shutil.copytree(path, dest)
    for p in [dest, *dest.rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)
    for p in [*dest.rglob("*"), dest]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)
    refused = subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "dubious ownership" in refused.stderr, \
        "the copy must be one git refuses without safe.directory"
    return dest


@pytest.fixture(scope="module", params=["as-given", "work-tree", "directory", "foreign-owner"])
def checkouts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Callable[[str], str]:
    """name -> spec of that checkout in the variant: as configured (a bare mirror, say), a
    sparse git work tree at the same commit, a plain directory (git archive) of it, a
    read-only copy owned by another user."""
    variant = request.param
    made: dict[str, str] = {}

    def get(name: str) -> str:
        if name in made:
            return made[name]
        spec = _spec(name)
        src = S.parse(f"prompts.sources.{name}", spec)
        commit = S.resolved_commit(src)
        if variant == "as-given":
            made[name] = spec
        elif variant == "foreign-owner":
            dest = tmp_path_factory.mktemp(f"{name}-foreign") / src.path.name
            made[name] = f"{_foreign_copy(src.path, dest)}@{src.commit}"
        elif variant == "work-tree":
            root = tmp_path_factory.mktemp(f"{name}-wt") / "repo"
            _git("clone", "-q", "--shared", "--no-checkout", str(src.path), str(root))
            _git("-C", str(root), "sparse-checkout", "set", "--no-cone", *FILES[name])
            _git("-C", str(root), "checkout", "-q", "--detach", commit)
            made[name] = str(root)
        else:
            root = tmp_path_factory.mktemp(f"{name}-dir")
            tar = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(src.path),
                                  "archive", commit, *FILES[name]],
                                 check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=tar, check=True)
            made[name] = str(root)
        return made[name]

    return get


def _read(spec: str, name: str, file: str) -> str:
    """The file's text, read independently of prompts/sources.py."""
    src = S.parse(f"prompts.sources.{name}", spec)
    if src.commit or not (src.path / file).exists():
        rev = src.commit or "HEAD"
        return _git("-C", str(src.path), "show", f"{rev}:{file}")
    return (src.path / file).read_text(encoding="utf-8")


def _official(module_text: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Top-level functions and string constants `names` of a module, defined in `namespace`."""
    tree = ast.parse(module_text)
    keep = [n for n in tree.body
            if (isinstance(n, ast.FunctionDef) and n.name in names)
            or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names
                                                  for t in n.targets))]
    # the official code runs here, in the test only, to be the yardstick
    exec(compile(ast.Module(body=keep, type_ignores=[]), "<official>", "exec"), namespace)  # noqa: S102
    return namespace


def _roles(module_text: str) -> set[str]:
    """The "role" values of every dict literal in a module (the messages it sends)."""
    out = set()
    for node in ast.walk(ast.parse(module_text)):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "role" and isinstance(v, ast.Constant):
                    out.add(v.value)
    return out


class RecordingClient:
    """The OpenAI client's chat.completions.create, recording the call."""

    def __init__(self, reply: str = '{"label": "CORRECT"}') -> None:
        self.reply = reply
        self.calls: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        msg = SimpleNamespace(content=self.reply)
        return SimpleNamespace(choices=[SimpleNamespace(message=msg)])


# Inputs with the characters that break naive formatting: braces, quotes, newlines, unicode.
QUESTION = 'When did Ana say "{braces}" to Ben?'
GOLD = "7 May 2023 – the week {before}"
REPLY = "Ana said it on 7 May.\nStep 2: {x}\nAnswer: 7 May 2023"


def _cfg(**sources: str | None) -> Any:
    # llm=scripted: a model that states no context, so no reader prompt is trimmed to fit
    return job_with({"prompts": {"reference_dir": None, "sources": {
        "lightmem": None, "mem0": None, "longmemeval": None, **sources}},
        "judge": {"protocol": "paper"},
        "answer": {"protocol": "paper", "entry_layout": "speakers", "speaker_groups": 2}},
        ["llm=scripted"])


def _mem0_extract_json() -> Any:
    """mem0's own extract_json (mem0/memory/utils.py at the judge's commit), when present."""
    spec = _spec("mem0")
    text = _read(spec, "mem0", "mem0/memory/utils.py")
    return _official(text, ["extract_json"], {"re": re})["extract_json"]


def _locomo_item() -> JudgeItem:
    return JudgeItem("c:q0", "c", QUESTION, GOLD, 2, "temporal", False, "7 May 2023", REPLY)


@pytest.mark.parametrize("name", ["lightmem", "mem0"])
def test_locomo_judge_equals_the_official_call(checkouts: Callable[[str], str], name: str) -> None:
    spec = checkouts(name)
    file = official.LIGHTMEM_JUDGE_FILE if name == "lightmem" else official.MEM0_JUDGE_FILE
    text = _read(spec, name, file)
    client = RecordingClient()
    ns = _official(text, ["ACCURACY_PROMPT", "evaluate_llm_judge", "extract_json"],
                   {"json": json, "re": re, "client": client,
                    "extract_json": lambda s: s})  # mem0 imports its own; the reply is JSON
    if name == "lightmem":
        assert ns["evaluate_llm_judge"](QUESTION, GOLD, REPLY, client_obj=client) == 1
    else:
        assert ns["evaluate_llm_judge"](QUESTION, GOLD, REPLY) == 1
    (call,) = client.calls
    texts = official_judges(_cfg(**{name: spec}))
    assert texts["locomo"]["judge_locomo"].source == name
    req = build_request(_locomo_item(), "j", Sampling(temperature=0.0, max_tokens=128), "paper", texts)
    assert [m.as_dict() for m in req.messages] == call["messages"]
    assert call["response_format"] == {"type": "json_object"} and req.schema is not None
    assert call["temperature"] == req.sampling.temperature
    # The label rule: 1 iff ours reads CORRECT (the official call raises on unreadable JSON,
    # which search_locomo.py scores 0; ours: unjudged, counted wrong).
    for reply in ['{"label": "CORRECT"}', '```json\n{"label": "CORRECT"}\n```', '{"label": "correct"}',
                  'Same. {"label": "CORRECT"}', "CORRECT", '{"label": "WRONG"}']:
        ns["client"] = client = RecordingClient(reply)
        args = {"client_obj": client} if name == "lightmem" else {}
        if name == "mem0":
            ns["extract_json"] = _mem0_extract_json()
        try:
            want = ns["evaluate_llm_judge"](QUESTION, GOLD, REPLY, **args) == 1
        except (ValueError, KeyError):
            want = False
        assert bool(read_label(_locomo_item(), "paper", None, reply, texts)) is want, reply


LME_CASES = [(t, False) for t in official.LONGMEMEVAL_TYPES] + [("temporal-reasoning", True)]


def test_longmemeval_judges_equal_get_anscheck_prompt(checkouts: Callable[[str], str]) -> None:
    from structmem_gpu.data.categories import LONGMEMEVAL_TYPES

    spec = checkouts("longmemeval")
    text = _read(spec, "longmemeval", official.LONGMEMEVAL_FILE)
    fn = _official(text, ["get_anscheck_prompt"], {})["get_anscheck_prompt"]
    assert _roles(text) == {"user"}
    texts = official_judges(_cfg(longmemeval=spec))
    seen = set()
    for qtype, abst in LME_CASES:
        item = JudgeItem("q_abs" if abst else "q", "c", QUESTION, GOLD, LONGMEMEVAL_TYPES[qtype],
                         qtype, abst, "x", REPLY)
        req = build_request(item, "j", Sampling(temperature=0.0, max_tokens=128), "paper", texts)
        want = fn(qtype, QUESTION, GOLD, REPLY, abstention=abst)
        assert [m.as_dict() for m in req.messages] == [{"role": "user", "content": want}]
        assert req.sampling.max_tokens == 10 and req.schema is None  # evaluate_qa.py: 10, text
        seen.add(want)
    assert len(seen) == 5  # 3 types share one template; temporal, update, preference, abstention


def _reader_inputs(cfg: Any) -> tuple[AnswerInputs, pl.DataFrame, pl.DataFrame, list[dict], list[dict]]:
    """One question, entries of three speakers in rank order, two summaries; and the same as
    the reference's retrieved payloads (time_stamp ISO, weekday as the session stamp's)."""
    t0 = datetime(2023, 5, 4, 13, 56)
    rows = [("Ana", "Ana went to India last year. "), ("Ben", "Ben adopted {a} dog."),
            ("Ana", "Ana's trip – 2 weeks."), ("Cy", "Cy, a third name."), ("Ben", "Ben moved.")]
    entries = schemas.frame([
        {"entry_id": f"e{i}", "conv_id": "c", "event_id": None, "dia_id": f"D1:{i}",
         "session_index": 1, "turn_index": i, "event_time": t0 + timedelta(days=3 * i),
         "speaker": sp, "kind": "fact", "text": tx, "request_id": "r", "prompt_version": "v",
         "model": "m"} for i, (sp, tx) in enumerate(rows)], schemas.ENTRIES)
    summaries = ["Ana and Ben planned {the} trip.", "Ben moved in June."]
    synth = pl.DataFrame({"synth_id": ["s0", "s1"], "text": summaries})
    ret = schemas.frame(
        [{"question_id": "c:q0", "conv_id": "c", "circuit": "entries", "rank": r,
          "item_id": f"e{i}", "score": 1.0 - r / 10} for r, i in enumerate([2, 1, 3, 0, 4])]
        + [{"question_id": "c:q0", "conv_id": "c", "circuit": "syntheses", "rank": r,
            "item_id": s, "score": 1.0} for r, s in enumerate(["s1", "s0"])],
        schemas.RETRIEVALS)
    questions = pl.DataFrame({"question_id": ["c:q0"], "conv_id": ["c"], "question": [QUESTION]})
    payloads = []
    for i in [2, 1, 3, 0, 4]:
        sp, tx = rows[i]
        when = t0 + timedelta(days=3 * i)
        payloads.append({"_retrieved_speaker": sp, "payload": {
            "speaker_name": sp, "time_stamp": when.isoformat(timespec="milliseconds"),
            "weekday": f"{when:%a}", "memory": tx}})
    ref_summaries = [{"payload": {"summary": summaries[1]}}, {"payload": {"summary": summaries[0]}}]
    inputs = AnswerInputs(JobConfig.from_cfg(cfg), questions, {"retrievals": ret, "entries": entries, "syntheses": synth})
    return inputs, ret, entries, payloads, ref_summaries


@pytest.mark.parametrize("reader,summary", [("ANSWER_PROMPT_StructMem", True), ("ANSWER_PROMPT", False)])
def test_reader_equals_search_locomo(checkouts: Callable[[str], str], reader: str, summary: bool) -> None:
    from structmem_gpu.methods.structmem.context import synthesis_texts

    spec = checkouts("lightmem")
    search = _read(spec, "lightmem", "experiments/locomo/search_locomo.py")
    # the names the official module's annotations use
    ns: dict[str, Any] = {"datetime": datetime, "logger": logging.getLogger("official"),
                          **{n: getattr(typing, n) for n in ("List", "Dict", "Any", "Optional")}}
    _official(_read(spec, "lightmem", official.LIGHTMEM_READER_FILE), list(official.READERS), ns)
    _official(_read(spec, "lightmem", "experiments/locomo/retrievers.py"), ["format_related_memories"], ns)
    _official(search, ["build_prompt_with_speaker_memories", "format_summaries"], ns)
    assert _roles(search) == {"system"}  # the reader prompt goes out as one system message
    cfg = _cfg(lightmem=spec)
    inputs, ret, entries, payloads, ref_summaries = _reader_inputs(cfg)
    want = ns["build_prompt_with_speaker_memories"](
        QUESTION, payloads, enable_summary=summary, summaries=ref_summaries if summary else None)
    texts = synthesis_texts(ret, inputs.table("syntheses")) if summary else None
    prompts = official_prompts(inputs, ret, entries, reader, texts)
    msgs = [m.as_dict() for m in prompts["c:q0"].messages]
    assert msgs == [{"role": "system", "content": want}]
    assert prompts["c:q0"].raw_reply and not prompts["c:q0"].reasoned_reply
    # no summaries retrieved: the reference's stand-in line
    if summary:
        want_empty = ns["build_prompt_with_speaker_memories"](QUESTION, payloads, True, [])
        empty = official_prompts(inputs, ret, entries, reader, {})
        assert empty["c:q0"].messages[0].content == want_empty
