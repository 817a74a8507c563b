"""Reading the user's dial481/locomo-audit checkout at run time (CC BY-NC 4.0: nothing of it is
copied into this repository; every file below is read with prompts/sources.py, as the official
texts are).

    ap-baseline/answer_key.json          the 1,540 questions of categories 1-4 with their golds
    ap-baseline/v1/ap_eval_results.json  specific-but-wrong answers to them (strategy v1)
    ap-baseline/v2/ap_eval_results.json  vague-but-topical answers to them (strategy v2)
    errors.json                          156 gold-answer errata (question, type, correct answer,
                                         correct evidence)
    data/locomo10.json                   the conversations: conversation index -> sample_id

The audit names a question `locomo_<conversation index>_qa<index in its qa list>`; its
categories are the file's ids (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop), ours.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.prompts import pinned
from structmem_gpu.prompts import sources as S

ANSWER_KEY = "ap-baseline/answer_key.json"
WRONG_SET_FILES = {"v1": "ap-baseline/v1/ap_eval_results.json",
                   "v2": "ap-baseline/v2/ap_eval_results.json"}
ERRORS = "errors.json"
CONVERSATIONS = "data/locomo10.json"
REPO_URL = "https://github.com/dial481/locomo-audit"
_ID = re.compile(r"^locomo_(\d+)_qa(\d+)$")


@dataclass(frozen=True)
class AuditQuestion:
    """One question of the audit's files (`answer` = the answer of the set it came from)."""

    question_id: str  # the audit's id, locomo_<conv>_qa<n>
    conversation: int  # index of the conversation in locomo10.json
    category: int
    question: str
    gold: str
    answer: str


def source(key: str, spec: str | None, job: JobConfig) -> S.Source:
    """The checkout of `key` (eval.judge_audit.source / eval.errata): `spec`, else the pinned
    copy under paths.official_dir. A missing checkout is one line saying what to pass."""
    if spec is None:
        paths = job.root.paths
        folder = paths.official_dir if paths is not None else None
        if folder is None:
            raise ConfigError(f"{key}=null and paths.official_dir is not set: pass {key}=PATH "
                              f"(a clone of {REPO_URL})")
        spec = pinned.source("locomo_audit", str(folder))
    return S.parse(key, spec, missing=f"pass {key}=PATH[@COMMIT] (a locomo-audit checkout, a "
                   f"clone of {REPO_URL}) or fetch the pinned one with `{pinned.FETCH_COMMAND}`")


def read_json(src: S.Source, file: str) -> Any:
    try:
        return json.loads(S.read_file(src, file))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{src.where()}: {file} is not JSON ({e})") from e


def split_id(src: S.Source, file: str, qid: str) -> tuple[int, int]:
    m = _ID.match(str(qid))
    if m is None:
        raise ConfigError(f"{src.where()}: {file}: question_id {qid!r} is not locomo_<conv>_qa<n>")
    return int(m.group(1)), int(m.group(2))


def answer_key(src: S.Source) -> list[AuditQuestion]:
    """The 1,540 questions with their golds as answers (the right-answer set's source)."""
    out = []
    for rec in read_json(src, ANSWER_KEY):
        conv, _ = split_id(src, ANSWER_KEY, rec["question_id"])
        gold = str(rec["golden_answer"])
        out.append(AuditQuestion(rec["question_id"], conv, int(rec["category"]),
                                 str(rec["question"]), gold, gold))
    return out


def wrong_answers(src: S.Source, name: str) -> list[AuditQuestion]:
    """The wrong-answer set `name` (v1 | v2): each question with its deliberately wrong answer."""
    file = WRONG_SET_FILES[name]
    data = read_json(src, file)
    out = []
    for items in (data.get("detailed_results") or {}).values():
        for rec in items:
            conv, _ = split_id(src, file, rec["question_id"])
            out.append(AuditQuestion(rec["question_id"], conv, int(rec["category"]),
                                     str(rec["question"]), str(rec["golden_answer"]),
                                     str(rec["generated_answer"])))
    if not out:
        raise ConfigError(f"{src.where()}: {file} holds no detailed_results")
    return out


def sample_ids(src: S.Source) -> list[str]:
    """sample_id of each conversation, in the audit's file order (its conversation index)."""
    return [str(c["sample_id"]) for c in read_json(src, CONVERSATIONS)]


def errata(src: S.Source) -> list[dict[str, Any]]:
    data = read_json(src, ERRORS)
    if not isinstance(data, list):
        raise ConfigError(f"{src.where()}: {ERRORS} is not a list of entries")
    return data


def describe(src: S.Source) -> dict[str, Any]:
    """What the manifest and the reports record of the checkout: its spec and commit."""
    return {"spec": src.spec, "commit": S.resolved_commit(src)}
