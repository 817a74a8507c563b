"""prompts.sources.*: official texts read from fake checkouts holding our own strings (work
tree, plain directory, git work tree, bare clone, PATH@COMMIT), the requests filled from them,
judge.input, and the error lines. The real checkouts: tests/unit/test_official_texts_match.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.errors import ConfigError, StructMemError
from structmem_gpu.eval.answer import AnswerPrompt, answer_rows
from structmem_gpu.eval.judge import (
    JudgeItem,
    build_request,
    judge_items,
    judge_texts_fingerprint,
    official_judges,
)
from structmem_gpu.llm.types import LLMResult, Message, Sampling
from structmem_gpu.eval.prompts import answer_official
from structmem_gpu.prompts import official
from structmem_gpu.methods.structmem.prompts import reference
from structmem_gpu.eval.prompts.answer_paper import PaperEntry
from structmem_gpu.config.job import JobConfig
from tests.fixtures.pipeline import job_with

READER = (
    "FAKE reader.\n{speaker_1_name}:\n{speaker_1_memories}\n{speaker_2_name}:\n"
    "{speaker_2_memories}\nSummaries:\n{session_summaries}\nQ: {question}\nA:"
)
FLAT_READER = "FAKE flat.\n{speaker_1_name}|{speaker_1_memories}|{speaker_2_name}|{speaker_2_memories}|{question}"
JUDGE = "FAKE judge {{json}}. Q={question} G={gold_answer} R={generated_answer}"
LIGHTMEM_FILES = {
    # as in LightMem, the package file holds extraction prompts of the same names (decoys here:
    # the LoCoMo build reads those of experiments/locomo/prompts.py)
    "src/lightmem/memory/prompts.py": (
        'LoCoMo_Event_Binding_factual = "DECOY fact"\n'
        'LoCoMo_Event_Binding_relational = "DECOY relation"\n'
        'LoCoMo_Cross_Event_Consolidation = "FAKE {bucket} {speakers} {aggregated_text} '
        '{supplementary_context}"\n'
    ),
    "src/lightmem/memory/utils.py": (
        "def call_summary_llm(manager, buffer_text, supplementary_text):\n"
        "    prompt = P.format(supplementary_context=supplementary_text or 'FAKE none')\n"
        "    return [{'role': 'system', 'content': 'FAKE system'}, {'role': 'user', 'content': prompt}]\n"
    ),
    "experiments/locomo/prompts.py": (
        f"ANSWER_PROMPT_StructMem = {READER!r}\nANSWER_PROMPT = {FLAT_READER!r}\n"
        'LoCoMo_Event_Binding_factual = "FAKE fact"\n'
        'LoCoMo_Event_Binding_relational = "FAKE relation"\n'
        'METADATA_GENERATE_PROMPT_locomo = "FAKE flat"\n'
    ),
    "experiments/locomo/llm_judge.py": f"import json\nACCURACY_PROMPT = {JUDGE!r}\n",
}
MEM0_FILES = {"evaluation/metrics/llm_judge.py": f"ACCURACY_PROMPT = {('MEM0 ' + JUDGE)!r}\n"}
LME_FILES = {
    "src/evaluation/evaluate_qa.py": '''
def get_anscheck_prompt(task, question, answer, response, abstention=False):
    if not abstention:
        if task in ['single-session-user', 'single-session-assistant', 'multi-session']:
            template = "PLAIN {} | {} | {}"
            prompt = template.format(question, answer, response)
        elif task == 'temporal-reasoning':
            template = "TEMPORAL {} | {} | {}"
        elif task == 'knowledge-update':
            template = "UPDATE {} | {} | {}"
        elif task == 'single-session-preference':
            template = "PREFERENCE {} | {} | {}"
        else:
            raise NotImplementedError
    else:
        template = "ABSTAIN {} | {} | {}"
    return template.format(question, answer, response)
'''
}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def repo(root: Path, files: dict[str, str]) -> tuple[Path, str]:
    """A git work tree with `files` committed; (path, commit)."""
    root.mkdir(parents=True)
    git(root, "init", "-q")
    write(root, files)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    return root, git(root, "rev-parse", "HEAD")


def cfg(**sources: str | None) -> JobConfig:
    return job_with({"prompts": {"reference_dir": sources.pop("reference_dir", None),
                                 "sources": {"lightmem": None, "mem0": None,
                                             "longmemeval": None, **sources}},
                     "judge": {"protocol": "paper"}})


def test_work_tree_bare_clone_and_commit_read_the_same_texts(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain", LIGHTMEM_FILES)
    work, first = repo(tmp_path / "work", LIGHTMEM_FILES)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    # A second commit changes the reader: PATH@first still reads the first text.
    write(work, {"experiments/locomo/prompts.py": "ANSWER_PROMPT_StructMem = 'NEW {speaker_1_name}'\n"
                                                  "LoCoMo_Event_Binding_relational = 'NEW'\n"})
    git(work, "commit", "-qam", "two")
    texts = {
        "plain": official.lightmem_reader(str(plain)),
        "bare": official.lightmem_reader(str(bare)),
        "at-commit": official.lightmem_reader(f"{work}@{first[:8]}"),
    }
    assert {k: t.text for k, t in texts.items()} == dict.fromkeys(texts, READER)
    assert texts["plain"].commit is None and texts["bare"].commit == first
    assert texts["at-commit"].commit == first
    # the same text at another commit keeps its prompt version (the response cache holds)
    assert len({t.version("reader") for t in texts.values()}) == 1
    built = official.build_texts(str(bare))
    assert {k: t.text for k, t in built.items()} == {
        "fact": "FAKE fact", "relation": "FAKE relation", "fact[flat]": "FAKE flat",
        "synthesis": "FAKE {bucket} {speakers} {aggregated_text} {supplementary_context}",
        "synthesis[system]": "FAKE system", "synthesis[no_context]": "FAKE none"}
    assert {k: t.file for k, t in built.items()} == {
        "fact": "experiments/locomo/prompts.py", "relation": "experiments/locomo/prompts.py",
        "fact[flat]": "experiments/locomo/prompts.py", "synthesis": "src/lightmem/memory/prompts.py",
        "synthesis[system]": "src/lightmem/memory/utils.py",
        "synthesis[no_context]": "src/lightmem/memory/utils.py"}
    assert reference.reference_prompt(f"{work}@{first}", "relation") == "FAKE relation"
    assert reference.reference_prompt(str(work), "relation") == "NEW"  # the work tree


@pytest.mark.parametrize(
    "spec,files,match",
    [
        ("{root}", {}, r"prompts.sources.lightmem='.*': .*experiments/locomo/prompts.py not found"),
        ("{root}", {"experiments/locomo/prompts.py": "X = 'y'\n"},
         r"defines no string 'ANSWER_PROMPT_StructMem' \(the reader ANSWER_PROMPT_StructMem\)"),
        ("{root}", {"experiments/locomo/prompts.py": "ANSWER_PROMPT_StructMem = '{question}'\n"},
         r"has fields \['question'\], expected"),
        ("{root}/missing", {}, r"missing.: .*missing does not exist .*python jobs/data.py official"),
        ("{root}@abc123", {}, r"not a git repository, so commit 'abc123' cannot be read"),
    ],
)
def test_error_lines_name_key_path_commit_and_what_is_missing(
    tmp_path: Path, spec: str, files: dict[str, str], match: str
) -> None:
    write(tmp_path, files)
    with pytest.raises(ConfigError, match=match):
        official.lightmem_reader(spec.format(root=tmp_path))


def test_git_errors_name_the_commit_and_the_file(tmp_path: Path) -> None:
    work, commit = repo(tmp_path / "mem0", {"README": "no judge here\n"})
    with pytest.raises(ConfigError, match=r"commit 'deadbeef' not found in"):
        official.locomo_judge(None, f"{work}@deadbeef")
    with pytest.raises(ConfigError, match=rf"evaluation/metrics/llm_judge.py does not exist at commit {commit}"):
        official.locomo_judge(None, f"{work}@{commit}")


def _give_away(root: Path) -> None:
    """Make `root` a read-only tree owned by another user (nobody): git's dubious ownership."""
    for p in [root, *root.rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)
    for p in [*root.rglob("*"), root]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~0o222)


@pytest.mark.skipif(os.geteuid() != 0, reason="a checkout owned by another user needs root (chown)")
@pytest.mark.parametrize("bare", [False, True])
def test_a_checkout_owned_by_another_user_is_read_and_a_refusal_says_why(
    tmp_path: Path, bare: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, commit = repo(tmp_path / "src", LIGHTMEM_FILES)
    root = work
    if bare:
        root = tmp_path / "lightmem.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(work), str(root)], check=True)
    _give_away(root)
    plain = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert "dubious ownership" in plain.stderr  # what git does without safe.directory
    assert official.lightmem_reader(f"{root}@{commit}").text == READER
    assert official.lightmem_reader(str(root)).commit == commit
    # git refusing the folder is reported in git's words, never as "not a git repository"
    from structmem_gpu.prompts import sources as S

    monkeypatch.setattr(S, "git_command", lambda path, *args: ["git", "-C", str(path), *args])
    other = tmp_path / "other"
    shutil.copytree(root, other, symlinks=True)
    _give_away(other)
    with pytest.raises(ConfigError, match="dubious ownership") as err:
        official.lightmem_reader(f"{other}@{commit}")
    assert "not a git repository" not in str(err.value) and "\n" not in str(err.value)


def test_reference_dir_is_an_alias_and_a_conflict_is_an_error(tmp_path: Path) -> None:
    a = str(write(tmp_path / "a", LIGHTMEM_FILES))
    assert official.source_spec(cfg(reference_dir=a), "lightmem") == a
    assert official.source_spec(cfg(lightmem=a), "lightmem") == a
    assert official.source_spec(cfg(reference_dir=a, lightmem=a), "lightmem") == a
    with pytest.raises(ConfigError, match="prompts.reference_dir=.* and prompts.sources.lightmem=.* differ"):
        official.source_spec(cfg(reference_dir=a, lightmem=a + "/"), "lightmem")


def test_longmemeval_templates_are_read_per_type_from_the_function(tmp_path: Path) -> None:
    texts = official.longmemeval_judges(str(write(tmp_path, LME_FILES)))
    assert {k: t.text.split()[0] for k, t in texts.items()} == {
        "single-session-user": "PLAIN", "single-session-assistant": "PLAIN",
        "multi-session": "PLAIN", "temporal-reasoning": "TEMPORAL",
        "knowledge-update": "UPDATE", "single-session-preference": "PREFERENCE",
        "abstention": "ABSTAIN",
    }
    (tmp_path / "src/evaluation/evaluate_qa.py").write_text(
        LME_FILES["src/evaluation/evaluate_qa.py"].replace("elif task == 'knowledge-update'", "elif task == 'other'")
    )
    with pytest.raises(ConfigError, match=r"has no template for \['knowledge-update'\]"):
        official.longmemeval_judges(str(tmp_path))


def _item(category: int = 1, name: str = "single_hop", abst: bool = False) -> JudgeItem:
    return JudgeItem("c:q0", "c", "Where?", "Rome", category, name, abst, "Rome",
                     "I think Rome.\nAnswer: Rome")


def test_judge_requests_fill_the_official_templates(tmp_path: Path) -> None:
    lm = str(write(tmp_path / "lm", LIGHTMEM_FILES))
    m0 = str(write(tmp_path / "m0", MEM0_FILES))
    lme = str(write(tmp_path / "lme", LME_FILES))
    texts = official_judges(cfg(lightmem=lm, longmemeval=lme))
    req = build_request(_item(), "j", Sampling(max_tokens=40), "paper", texts)
    assert [m.as_dict() for m in req.messages] == [
        {"role": "user", "content": "FAKE judge {json}. Q=Where? G=Rome R=I think Rome.\nAnswer: Rome"}
    ]
    assert req.prompt_version == texts["locomo"]["judge_locomo"].version("judge_locomo")
    assert req.schema is not None  # JSON mode, as response_format json_object
    # mem0 wins when both are given
    both = official_judges(cfg(lightmem=lm, mem0=m0))
    req = build_request(_item(), "j", Sampling(max_tokens=40), "paper", both)
    assert req.messages[0].content.startswith("MEM0 FAKE judge")
    lme_req = build_request(_item(104, "multi-session"), "j", Sampling(max_tokens=40), "paper", texts)
    assert lme_req.messages == (Message("user", "PLAIN Where? | Rome | I think Rome.\nAnswer: Rome"),)
    assert lme_req.sampling.max_tokens == 10 and lme_req.schema is None
    abst = build_request(_item(106, "temporal-reasoning", True), "j", Sampling(), "paper", texts)
    assert abst.messages[0].content.startswith("ABSTAIN Where?")
    # protocol reasoned keeps our own judge
    ours = build_request(_item(), "j", Sampling(max_tokens=40), "reasoned", texts)
    assert "FAKE" not in ours.messages[-1].content


def test_judge_fingerprint_follows_the_texts_not_the_path(tmp_path: Path) -> None:
    a = str(write(tmp_path / "a", LIGHTMEM_FILES))
    b = str(write(tmp_path / "b", LIGHTMEM_FILES))
    assert judge_texts_fingerprint(cfg()) is None
    fa = judge_texts_fingerprint(cfg(lightmem=a))
    assert fa is not None and fa == judge_texts_fingerprint(cfg(lightmem=b))
    (tmp_path / "b/experiments/locomo/llm_judge.py").write_text(
        f"ACCURACY_PROMPT = {JUDGE.replace('FAKE', 'OTHER')!r}\n"
    )
    assert judge_texts_fingerprint(cfg(lightmem=b)) != fa


def test_manifest_records_commit_and_hashes_never_the_text(tmp_path: Path) -> None:
    work, commit = repo(tmp_path / "lm", LIGHTMEM_FILES)
    m0 = write(tmp_path / "m0", {"README": "x"})
    rec = official.manifest(cfg(lightmem=str(work), mem0=str(m0)))
    assert rec is not None and rec["lightmem"]["commit"] == commit
    texts = rec["lightmem"]["texts"]
    assert set(texts) == {"fact", "relation", "synthesis", "fact[flat]", "synthesis[system]",
                          "synthesis[no_context]", "reader[ANSWER_PROMPT_StructMem]",
                          "reader[ANSWER_PROMPT]", "judge_locomo"}
    assert texts["relation"]["file"] == "experiments/locomo/prompts.py"
    assert texts["synthesis[system]"]["name"] == "call_summary_llm[system]"
    assert texts["judge_locomo"]["sha256_10"] == official.locomo_judge(str(work), None).digest
    assert "FAKE" not in str(rec["lightmem"])
    assert "llm_judge.py" in rec["mem0"]["incomplete"] and rec["judge_locomo_from"] == "mem0"
    assert official.manifest(cfg()) is None


def test_judge_input_reply_or_answer() -> None:
    q = pl.DataFrame({"question_id": ["c:q0"], "conv_id": ["c"], "question": ["Where?"],
                      "answer": ["Rome"], "category": [1], "category_name": ["single_hop"],
                      "is_abstention": [False]})
    a = pl.DataFrame({"question_id": ["c:q0"], "prediction": ["Rome"],
                      "reply": ["Jon flew to Rome.\nAnswer: Rome"]})
    (reply,) = judge_items(q, a, "reply")
    (answer,) = judge_items(q, a, "answer")
    assert (reply.judge_text, reply.prediction) == ("Jon flew to Rome.\nAnswer: Rome", "Rome")
    assert answer.judge_text == "Rome"
    with pytest.raises(StructMemError, match="judge.input=reply but answers.parquet has no reply column"):
        judge_items(q, a.drop("reply"), "reply")


def test_official_reader_fill_and_raw_reply(tmp_path: Path) -> None:
    spec = str(write(tmp_path, LIGHTMEM_FILES))
    t = official.lightmem_reader(spec)
    e = [PaperEntry("Ana", datetime(2023, 5, 4, 13, 0), "Ana went to India. "),
         PaperEntry("Ben", None, "Ben stayed."), PaperEntry("Ana", datetime(2023, 6, 1), "Ana came back."),
         PaperEntry("Cy", datetime(2023, 6, 2), "third speaker, left out")]
    (msg,) = answer_official.build_messages(t, "Where?", e, ["S one", "S two"])
    assert msg.role == "system"
    assert msg.content == (
        "FAKE reader.\nAna:\n[Memory recorded on: 04 May 2023, Thu]\nAna went to India.\n\n"
        "[Memory recorded on: 01 June 2023, Thu]\nAna came back.\nBen:\n"
        "[Memory recorded on: , ]\nBen stayed.\nSummaries:\nS one\nS two\nQ: Where?\nA:"
    )
    (empty,) = answer_official.build_messages(t, "Where?", [], [])
    assert "Speaker 1:\nNo memories available.\nSpeaker 2:\nNo memories available." in empty.content
    assert "No session summaries available." in empty.content
    (flat,) = answer_official.build_messages(official.lightmem_reader(spec, "ANSWER_PROMPT"),
                                             "Where?", e[1:2], None)
    assert flat.content == "FAKE flat.\nBen|[Memory recorded on: , ]\nBen stayed.|Speaker 2|No memories available.|Where?"
    q = pl.DataFrame({"question_id": ["a", "b"], "conv_id": ["c", "c"]})
    res = [LLMResult("r1", "Step 1 ...\nAnswer: India", None, True, 0, 0, None, 0.0, "stop", False, 1, "m", "x"),
           LLMResult("r2", "", None, False, 0, 0, None, 0.0, "error", False, 1, "m", "x",
                     error="HTTP 500")]
    prompts = {k: AnswerPrompt((msg,), t.version("reader"), raw_reply=True) for k in "ab"}
    rows = answer_rows(q, res, prompts, "paper")
    assert rows["prediction"].to_list() == ["Step 1 ...\nAnswer: India", ""]
    assert rows["reply"].to_list() == ["Step 1 ...\nAnswer: India", None]
    assert rows["reasoning"].to_list() == [None, None]


def test_report_names_the_judge_input_and_hypotheses_follow_it() -> None:
    from structmem_gpu.eval.report import hypotheses_jsonl, run_protocols
    from structmem_gpu.eval.report_md import JUDGE_INPUTS

    c = job_with({"judge": {"protocol": "paper", "input": "reply"},
                  "answer": {"protocol": "paper"}})
    notes = {"stages": {"judge": {"notes": {"protocol": "paper", "judge_input": "answer"}}}}
    assert run_protocols(c, notes)["judge_input"] == "answer"
    assert run_protocols(c, {"stages": {"judge": {"notes": {"protocol": "paper"}}}})["judge_input"] == "answer"
    assert run_protocols(c, {})["judge_input"] == "reply"
    assert set(JUDGE_INPUTS) == {"reply", "answer"}
    q = pl.DataFrame({"question_id": ["a"]})
    a = pl.DataFrame({"question_id": ["a"], "prediction": ["Rome"], "reply": ["So: Rome\nAnswer: Rome"]})
    assert '"hypothesis": "So: Rome\\nAnswer: Rome"' in hypotheses_jsonl(q, a, "reply")
    assert '"hypothesis": "Rome"' in hypotheses_jsonl(q, a, "answer")


def test_official_reader_only_on_locomo_format_benchmarks_under_paper(tmp_path: Path) -> None:
    from structmem_gpu.eval.answer import builder_fingerprint
    from structmem_gpu.methods.structmem.context import official_reader

    spec = str(write(tmp_path, LIGHTMEM_FILES))

    def c(bench: str, protocol: str = "paper", prompt: str = "structmem") -> object:
        return job_with({
            "prompts": {"reference_dir": spec, "sources": {"lightmem": None}},
            "benchmark": {"name": bench},
            "answer": {"protocol": protocol,
                       "prompt": f"structmem_gpu.methods.{prompt}:build_prompts"}})

    assert official_reader(c("locomo")) and official_reader(c("sample"))
    assert not official_reader(c("longmemeval")) and not official_reader(c("locomo", "reasoned"))
    fp = builder_fingerprint(c("locomo", prompt="structmem.context"))
    flat = builder_fingerprint(c("locomo", prompt="baselines.flat"))
    assert fp is not None and flat is not None and fp != flat  # each its own reader text
    assert builder_fingerprint(c("longmemeval", prompt="structmem.context")) is None
    assert builder_fingerprint(c("locomo", prompt="seem.context")) is None  # reads no text


def test_a_missing_official_text_stops_the_job_before_the_first_stage(tmp_path: Path) -> None:
    from structmem_gpu.run.pipeline import run_stages
    from structmem_gpu.stage import Stage

    ran: list[str] = []

    def make(ctx: object) -> dict[str, pl.DataFrame]:
        ran.append("make")
        return {"numbers": pl.DataFrame({"x": [1]})}

    registry = {
        "make": Stage("make", make, writes=("numbers",)),
        "late": Stage("late", make, writes=("numbers",), extra_fingerprint=judge_texts_fingerprint),
    }
    c = job_with({
        "prompts": {"sources": {"lightmem": None, "mem0": str(write(tmp_path / "m0", {"README": "x"})),
                                "longmemeval": None}},
        "judge": {"protocol": "paper"}, "method": {"stages": ["make", "late"]},
        "paths": {"cache_dir": "/nonexistent"}})
    with pytest.raises(ConfigError, match=r"prompts.sources.mem0=.*llm_judge.py.*PATH@b3ede5b"):
        run_stages(c, tmp_path / "run", registry)
    assert ran == [] and not (tmp_path / "run" / "tables").exists()


def test_lightmem_judge_text_reads_its_json_as_lightmem_does(tmp_path: Path) -> None:
    from structmem_gpu.eval.judge import read_label

    lm = str(write(tmp_path / "lm", LIGHTMEM_FILES))
    m0 = str(write(tmp_path / "m0", MEM0_FILES))
    chatty = 'Same city. {"label": "CORRECT"}'  # JSON after prose: mem0 finds it, LightMem not
    fenced = 'ok\n```json\n{"label": "CORRECT"}\n```'
    for texts, chatty_label in ((official_judges(cfg(lightmem=lm)), None),
                                (official_judges(cfg(lightmem=lm, mem0=m0)), True),
                                (None, True)):
        assert read_label(_item(), "paper", None, chatty, texts) is chatty_label
        assert read_label(_item(), "paper", None, fenced, texts) is True
