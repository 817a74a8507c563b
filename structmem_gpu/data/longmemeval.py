"""LongMemEval loader: `longmemeval_{s_cleaned,m_cleaned,oracle}.json` -> (turns, questions).

    turns, questions = load_longmemeval("data/longmemeval_s_cleaned.json", question_ids=None)

Every instance is its own conversation (conv_id = question_id) over its haystack sessions.
One instance (from the hand-written format example `longmemeval_synthetic_example.json`):

    {"question_id": "synthetic_0001", "question_type": "knowledge-update",
     "question": "Where do I work now?", "answer": "Northwind",
     "question_date": "2023/06/01 (Thu) 10:15",
     "haystack_session_ids": ["answer_synth01_1", "ultrachat_000001", "answer_synth01_2"],
     "haystack_dates": ["2023/05/02 (Tue) 09:12", …],
     "haystack_sessions": [[{"role": "user", "content": "I just started a job at Contoso.",
                             "has_answer": true}, {"role": "assistant", …}], …],
     "answer_session_ids": ["answer_synth01_1", "answer_synth01_2"]}
    turns:     conv_id="synthetic_0001" session_index=1 session_id="answer_synth01_1"
               turn_index=0 dia_id="answer_synth01_1_1" speaker="user" has_answer=True
    questions: question_id="synthetic_0001" category=105 category_name="knowledge-update"
               evidence=["answer_synth01_1_1", "answer_synth01_2_1"] is_abstention=False

Rules (docs/evaluation.md "LongMemEval loader rules"):
- Sessions keep list order; they are not re-sorted by date, because same-day sessions may be
  out of time order in the released files. session_index = list position + 1.
- dia_id = `<session_id>_<n>`, n = 1-based position in the session counting all turns, the
  turn-level corpus id of LongMemEval's own retrieval code; speaker = role.
- evidence = dia_ids of `has_answer: true` turns inside `answer_session_ids` sessions (turn
  level); evidence_raw = `answer_session_ids` as in the file (session level). `_abs` items keep
  their evidence; evaluation excludes them from retrieval averages.
- session_hash hashes (turns, date) only, so a session shared by several haystacks with the
  same date shares its hash (and its memory). LongMemEval's recipe draws each haystack's
  dates afresh, so a shared pool session usually has another date (and hash) per haystack.
- A haystack that lists the same session id twice (13 histories of the real
  `longmemeval_s_cleaned.json`: identical turns, other dates, filler) keeps both occurrences
  in list order as distinct sessions: the later copy's session_id becomes
  `<id>#repeat<n>` (n = 2, 3, ...), so its dia_ids are unique; one warning line per affected
  instance; the load stage's notes count them (`repeated_sessions`).
- The file is streamed one instance at a time (data/jsonstream.py) and each distinct session
  content (id + turns + flags) is stored once, its dates once per occurrence (turns_store.py,
  the compact layout the load stage writes); an equal raw session seen again, at any date,
  is not parsed again (`_Memo`): only its date and session_hash are computed. `load_longmemeval` returns the plain
  frame (the expansion, exactly the rows the whole-file loader gave).
- Unknown keys (the example's `_note`) are ignored. A turn whose `content` is missing or blank
  is an InputError (LongMemEval has no image turns that could carry it), and so is a role
  other than `user` / `assistant` (the only two the benchmark has; any other would silently
  become a third speaker).
- Only the selected instances are validated.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.data.categories import LONGMEMEVAL_TYPES
from structmem_gpu.data.common import (
    Question,
    RawTurn,
    Turn,
    check_max_sessions,
    check_selection,
    gold_text,
    parse_time,
    questions_frame,
    require,
    require_str,
    session_hash,
    session_turns,
)
from structmem_gpu.data.jsonstream import iter_json_list
from structmem_gpu.core.errors import InputError
from structmem_gpu.core.turns_store import CompactTurns, SessionStore

__all__ = [
    "DATE_FORMAT",
    "REPEAT_MARK",
    "load_longmemeval",
    "load_longmemeval_compact",
    "longmemeval_speakers",
    "repeated_sessions",
]

log = logging.getLogger(__name__)

DATE_FORMAT: Final = "%Y/%m/%d (%a) %H:%M"  # "2023/04/10 (Mon) 23:07"
ABSTENTION_SUFFIX: Final = "_abs"
ROLES: Final = ("user", "assistant")  # a turn's role is its speaker: the benchmark's only two
REPEAT_MARK: Final = "#repeat"  # session_id suffix of a repeated occurrence: "<id>#repeat2"


def longmemeval_speakers(conversations: Sequence[str]) -> pl.DataFrame:
    """schemas.CONVERSATIONS for these question ids: every haystack's speakers are the roles,
    the user as speaker_a and the assistant as speaker_b (LoCoMo's roles for a system's
    user/agent pairing, e.g. MemoryOS's pages of a user input and the agent's response)."""
    return schemas.frame([{"conv_id": c, "speaker_a": ROLES[0], "speaker_b": ROLES[1]}
                          for c in conversations], schemas.CONVERSATIONS)
_REQUIRED: Final = (
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
    "answer_session_ids",
)


def load_longmemeval(
    path: str | Path,
    question_ids: Sequence[str] | None = None,
    max_sessions: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(turns, questions) frames with schemas.TURNS / schemas.QUESTIONS.

    `question_ids`: instances to keep, in file order (None = all). `max_sessions`: keep the
    first N haystack sessions; an instance whose evidence is empty or not entirely inside them
    is dropped together with its turns (its conversation exists only for that question).
    Raises InputError naming the file and record for malformed input; pure (writes nothing).
    The plain frame repeats every shared session per haystack: for LongMemEval-M use
    `load_longmemeval_compact`, which the load stage writes.
    """
    compact, questions = load_longmemeval_compact(path, question_ids, max_sessions)
    return compact.expand(), questions


def load_longmemeval_compact(
    path: str | Path,
    question_ids: Sequence[str] | None = None,
    max_sessions: int | None = None,
) -> tuple[CompactTurns, pl.DataFrame]:
    """As `load_longmemeval`, with the turns in the compact layout (turns_store.py): the file
    is streamed one instance at a time and each distinct session's turns are kept once, so
    memory grows with distinct sessions, not with haystack length x questions."""
    p = Path(path)
    check_max_sessions(max_sessions)
    wanted = set(question_ids) if question_ids is not None else None
    ids: list[str] = []
    seen: set[str] = set()
    store = SessionStore()
    memo = _Memo()
    questions: list[Question] = []
    dropped = 0
    for i, record in enumerate(iter_json_list(p)):
        record = require(p, record, ("question_id",), f"record {i}", "instance")
        qid = require_str(p, record["question_id"], "question_id", f"record {i}")
        if qid in seen:
            raise InputError(p, "duplicate question_id", qid)
        seen.add(qid)
        ids.append(qid)
        if wanted is not None and qid not in wanted:
            continue
        per_session, question = _load_instance(p, qid, record, max_sessions, memo)
        if question is None:
            dropped += 1
            continue
        for occ in per_session:
            if occ.turns is None:  # validated and stored before: only the occurrence row
                store.add_known(qid, occ.index, occ.key, occ.session_hash, occ.time)
            else:
                key = store.add(qid, occ.index, occ.turns)
                memo.remember(occ, key)
        questions.append(question)
    check_selection(p, question_ids, ids, "question")
    compact = store.finish()
    log.info(
        "%s: %d instances, %d turns (%d in distinct sessions); %d instances dropped by "
        "max_sessions=%s",
        p.name,
        len(questions),
        compact.turn_count,
        compact.sessions.height,
        dropped,
        max_sessions,
    )
    return compact, questions_frame(questions)


def repeated_sessions(turns: pl.DataFrame) -> int:
    """How many sessions of `turns` are repeated occurrences of an earlier session id."""
    if turns.height == 0:
        return 0
    rep = turns.filter(pl.col("session_id").str.contains(REPEAT_MARK, literal=True))
    return rep.select("conv_id", "session_id").unique().height


def _str_list(path: Path, value: Any, what: str, record: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(path, f"{what} must be a list, got {type(value).__name__}", record)
    return value


@dataclass(slots=True)
class _Occurrence:
    """One haystack entry of an instance: its parsed turns, or (seen before) only its key."""

    index: int  # session_index
    original: str  # the file's session id (before a #repeat rename)
    dia_ids: tuple[str, ...]
    has_answer: tuple[bool | None, ...]
    turns: list[Turn] | None  # None = an equal session is stored already (key set)
    key: str = ""
    digest: bytes | None = None
    session_hash: str = ""  # set when turns is None (else on the turns)
    time: datetime | None = None


class _Memo:
    """Sessions stored so far, by a digest of their raw content, and parsed dates.

    LongMemEval-M repeats each pool session in ~12 haystacks (500 questions), each time at a
    date drawn for that haystack; an equal raw session (same renamed id, roles, contents,
    has_answer values) validates the same way at any date, so it is parsed once. The digest is
    blake2b-128 of exactly the fields the parse reads, except the date (parsed on its own); a
    session that is not a list of JSON objects has no digest and takes the full path (which
    raises the error). Costs ~1 kB per distinct content.
    """

    def __init__(self) -> None:
        self.known: dict[bytes, tuple[str, tuple[str, ...], tuple[bool | None, ...]]] = {}
        self.times: dict[str, datetime] = {}

    def time(self, path: Path, date: Any, record: str) -> datetime:
        if isinstance(date, str) and date in self.times:
            return self.times[date]
        t = parse_time(path, date, DATE_FORMAT, record, "session date")
        self.times[date] = t
        return t

    @staticmethod
    def digest(sid: str, items: Any) -> bytes | None:
        if not isinstance(items, list):
            return None
        h = hashlib.blake2b(digest_size=16)
        h.update(repr((sid, len(items))).encode())
        for it in items:
            if not isinstance(it, dict):
                return None
            h.update(repr((it.get("role", _MISSING), it.get("content"),
                           it.get("has_answer"))).encode())
        return h.digest()

    def remember(self, occ: _Occurrence, key: str) -> None:
        if occ.digest is not None:
            self.known[occ.digest] = (key, occ.dia_ids, occ.has_answer)


_MISSING = object()  # a turn without a "role" key (an error) digests apart from role=None


def _load_instance(
    path: Path, qid: str, rec: Mapping[str, Any], max_sessions: int | None, memo: _Memo
) -> tuple[list[_Occurrence], Question | None]:
    rec = require(path, rec, _REQUIRED, qid, "instance")
    qtype = require_str(path, rec["question_type"], "question_type", qid)
    if qtype not in LONGMEMEVAL_TYPES:
        raise InputError(
            path,
            f"unknown question_type {qtype!r} (expected one of {list(LONGMEMEVAL_TYPES)})",
            qid,
        )
    question = require_str(path, rec["question"], "question", qid)
    answer = gold_text(path, rec["answer"], "answer", qid)
    question_time = parse_time(path, rec["question_date"], DATE_FORMAT, qid, "question_date")
    sids = _str_list(path, rec["haystack_session_ids"], "haystack_session_ids", qid)
    dates = _str_list(path, rec["haystack_dates"], "haystack_dates", qid)
    sessions = _str_list(path, rec["haystack_sessions"], "haystack_sessions", qid)
    answer_sids = _str_list(path, rec["answer_session_ids"], "answer_session_ids", qid)
    if not (len(sids) == len(dates) == len(sessions)):
        raise InputError(
            path,
            "haystack_session_ids, haystack_dates and haystack_sessions differ in length "
            f"({len(sids)}, {len(dates)}, {len(sessions)})",
            qid,
        )
    if not sessions:
        raise InputError(path, "instance has no haystack sessions", qid)
    if not all(isinstance(s, str) for s in answer_sids):
        raise InputError(path, f"answer_session_ids must be strings, got {answer_sids!r}", qid)

    answer_set = set(answer_sids)
    seen: dict[str, str] = {}
    occurrences: dict[str, int] = {}
    per_session: list[_Occurrence] = []
    for i, (sid, date, items) in enumerate(zip(sids, dates, sessions, strict=True)):
        sid = require_str(path, sid, "haystack session id", f"{qid} session {i + 1}")
        time = memo.time(path, date, f"{qid} {sid}")
        occurrences[sid] = occurrences.get(sid, 0) + 1
        unique = sid if occurrences[sid] == 1 else f"{sid}{REPEAT_MARK}{occurrences[sid]}"
        digest = memo.digest(unique, items)
        known = memo.known.get(digest) if digest is not None else None
        if known is not None:
            key, dia_ids, flags = known
            # The parse's turns are (role, content, no caption); the digest says these items
            # passed it, so the occurrence's (turns + date) hash comes from them directly.
            h = session_hash([(it["role"], it["content"], None) for it in items], time)
            for dia_id in dia_ids:  # the id-collision check _load_session makes
                if dia_id in seen:
                    raise InputError(
                        path, f"duplicate dia_id {dia_id!r} (session ids collide in the haystack)",
                        f"{qid} {unique} {dia_id}")
                seen[dia_id] = unique
            per_session.append(_Occurrence(i + 1, sid, dia_ids, flags, None, key, digest, h,
                                           time))
            continue
        turns = _load_session(path, qid, i + 1, unique, time, items, seen)
        per_session.append(_Occurrence(i + 1, sid, tuple(t.dia_id for t in turns),
                                       tuple(t.has_answer for t in turns), turns, "", digest))
    repeated = {sid: n for sid, n in occurrences.items() if n > 1}
    if repeated:
        log.warning(
            "%s: instance %s lists session id(s) %s more than once; every occurrence is kept "
            "in list order as its own session (later copies renamed <id>%s<n>)",
            path.name,
            qid,
            ", ".join(f"{sid!r} x{n}" for sid, n in sorted(repeated.items())),
            REPEAT_MARK,
        )
    evidence = tuple(
        dia_id
        for occ in per_session
        if occ.original in answer_set
        for dia_id, flag in zip(occ.dia_ids, occ.has_answer, strict=True)
        if flag is True
    )
    if max_sessions is not None:
        per_session = per_session[:max_sessions]
        kept = {dia_id for occ in per_session for dia_id in occ.dia_ids}
        if not evidence or not all(e in kept for e in evidence):
            return [], None
    q = Question(
        conv_id=qid,
        question_id=qid,
        question=question,
        answer=answer,
        adversarial_answer=None,
        category=LONGMEMEVAL_TYPES[qtype],
        category_name=qtype,
        evidence=evidence,
        evidence_raw=tuple(answer_sids),
        question_time=question_time,
        is_abstention=qid.endswith(ABSTENTION_SUFFIX),
    )
    return per_session, q


def _load_session(
    path: Path, qid: str, index: int, sid: str, time: datetime, items: Any, seen: dict[str, str]
) -> list[Turn]:
    record = f"{qid} {sid}"
    if not isinstance(items, list):
        raise InputError(
            path, f"session must be a list of turns, got {type(items).__name__}", record
        )
    if not items:
        raise InputError(path, "session has no turns", record)
    parsed: list[RawTurn] = []
    for k, item in enumerate(items):
        dia_id = f"{sid}_{k + 1}"
        where = f"{qid} {sid} {dia_id}"
        item = require(path, item, ("role",), where, "turn")
        role = require_str(path, item["role"], "role", where)
        if role not in ROLES:
            raise InputError(path, f"unknown role {role!r}; expected one of {list(ROLES)}", where)
        content = item.get("content")
        content = "" if content is None else require_str(path, content, "content", where)
        if not content.strip():
            raise InputError(path, "turn has no text (missing or empty content)", where)
        has_answer = item.get("has_answer")
        if has_answer is not None and not isinstance(has_answer, bool):
            raise InputError(path, f"has_answer must be true/false, got {has_answer!r}", where)
        if dia_id in seen:
            # Cannot happen for a repeated session id (renamed above); guards id collisions
            # such as a real session id that already ends in "#repeat2".
            raise InputError(
                path, f"duplicate dia_id {dia_id!r} (session ids collide in the haystack)", where
            )
        seen[dia_id] = sid
        parsed.append(RawTurn(dia_id, role, content, None, has_answer))
    return list(session_turns(qid, index, sid, time, parsed))
