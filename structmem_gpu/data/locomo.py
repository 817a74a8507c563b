"""LoCoMo loader: `locomo10.json` (or the bundled sample) -> (turns, questions) frames, and
each conversation's two named speakers.

    turns, questions = load_locomo("data/locomo10.json", conversations=["conv-26"], max_sessions=3)
    speakers = load_locomo_speakers("data/locomo10.json", ["conv-30"])  # conv-30, Jon, Gina

A file record (bundled sample, `structmem_gpu/data/sample/sample_locomo.json`) and the rows
it becomes:

    {"sample_id": "sample-1", "conversation": {"speaker_a": "Lena", "speaker_b": "Tomas",
       "session_2_date_time": "7:05 pm on 17 March, 2024",
       "session_2": [{"speaker": "Tomas", "dia_id": "D2:4",
                      "text": "Here he is on his first walk!", "img_url": ["https://…"],
                      "blip_caption": "a photo of a small beagle puppy …"}, …]},
     "qa": [{"question": "What is the name of the dog Lena adopted?",
             "adversarial_answer": "Biscuit", "evidence": ["D2:1"], "category": 5}, …]}
    turns:     conv_id="sample-1" session_index=2 session_id="S2" turn_index=3 dia_id="D2:4"
               event_id="sample-1:D2:4" image_caption="a photo of a small beagle puppy …"
    questions: question_id="sample-1:q8" answer="Biscuit" adversarial_answer="Biscuit"
               category=5 category_name="adversarial" evidence=["D2:1"] is_abstention=True
    speakers:  conv_id="sample-1" speaker_a="Lena" speaker_b="Tomas"

speaker_a is not always the first to speak: in conv-30, 41, 42, 43, 47 and 49 of the released
file speaker_b opens the conversation (a system that pairs a speaker_a turn with the reply
after it, MemoryOS's driver, needs the file's roles, not the order of appearance).

Irregularities of the released file and the rule applied to each
(docs/evaluation.md "LoCoMo loader rules"):
category-5 items without `answer` (gold = answer if present else adversarial_answer), integer
golds (str()'d), orphan `session_<n>_date_time` keys (sessions come from `session_<n>` keys,
sorted numerically), malformed evidence ids (`normalise_evidence`), image turns
(`blip_caption` -> image_caption; prompts render it with `display_text`).

Decisions: a turn with no text is accepted only when it has a caption (an image-only turn);
otherwise it is an InputError. Only the selected conversations are validated. `is_abstention`
is True for category 5 (adversarial questions are unanswerable from the conversation).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL, LOCOMO_CATEGORIES
from structmem_gpu.data.common import (
    Question,
    RawTurn,
    Turn,
    check_max_sessions,
    check_selection,
    display_text,
    gold_text,
    parse_time,
    questions_frame,
    read_json_list,
    require,
    require_str,
    session_turns,
    turns_frame,
)
from structmem_gpu.core.errors import InputError

__all__ = ["LOCOMO_SHA256", "DATE_FORMAT", "display_text", "load_locomo", "load_locomo_speakers",
           "normalise_evidence"]

log = logging.getLogger(__name__)

# sha256 of the released snap-research/LoCoMo data/locomo10.json
# (docs/evaluation.md "LoCoMo file").
LOCOMO_SHA256: Final = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
DATE_FORMAT: Final = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"

_SESSION_KEY = re.compile(r"session_(\d+)")
# One evidence id after splitting: "D8:6", "D:11:26" (stray colon), "D30:05" (leading zero).
_EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")


@dataclass(frozen=True)
class Evidence:
    """A question's evidence after normalisation against the conversation's dia_ids."""

    ids: tuple[str, ...]  # resolved dia_ids, file order, no duplicates
    recovered: tuple[str, ...]  # raw ids that were malformed but fully resolved after normalising
    unresolved: tuple[str, ...]  # raw ids with at least one piece that matches no dia_id (dropped)


def normalise_evidence(raw: Sequence[str], known: set[str] | frozenset[str]) -> Evidence:
    """Resolve a raw evidence list: split on `;`/whitespace, drop a stray `:` after `D`,
    strip leading zeros; keep what matches a known dia_id.

    On the released file this recovers 6 of the 9 malformed ids ('D8:6; D9:17', 'D:11:26',
    'D30:05' and three space-joined lists) and leaves 3 ('D', 'D10:19', 'D4:36') unresolved.
    """
    ids: dict[str, None] = {}  # ordered set: a list repeated in the file counts once
    recovered: list[str] = []
    unresolved: list[str] = []
    for item in raw:
        if item in known:  # fast path: 99.5% of ids are already well formed
            ids.setdefault(item)
            continue
        good, bad = [], []
        for piece in _EVIDENCE_SPLIT.split(item.strip()):
            if not piece:
                continue
            m = _EVIDENCE_ID.fullmatch(piece)
            cand = f"D{int(m.group(1))}:{int(m.group(2))}" if m else piece
            (good if cand in known else bad).append(cand)
        for cand in good:
            ids.setdefault(cand)
        (unresolved if bad or not good else recovered).append(item)
    return Evidence(tuple(ids), tuple(recovered), tuple(unresolved))


@dataclass(frozen=True)
class _Session:
    number: int
    turns: tuple[Turn, ...]


def load_locomo(
    path: str | Path,
    conversations: Sequence[str] | None = None,
    max_sessions: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(turns, questions) frames with schemas.TURNS / schemas.QUESTIONS.

    `conversations`: sample ids to keep, in file order (None = all). `max_sessions`: keep the
    first N sessions of each conversation and only the questions whose evidence is non-empty
    and lies entirely inside them (a question without evidence cannot be shown to be
    answerable from a prefix, so it is dropped when truncating and kept otherwise).
    Raises InputError naming the file and record for any malformed input; pure (writes nothing).
    """
    p = Path(path)
    check_max_sessions(max_sessions)
    data, raw = read_json_list(p)
    _log_checksum(p, raw)
    samples = [
        require(p, s, ("sample_id", "conversation", "qa"), f"record {i}", "sample")
        for i, s in enumerate(data)
    ]
    ids = [
        require_str(p, s["sample_id"], "sample_id", f"record {i}") for i, s in enumerate(samples)
    ]
    seen: set[str] = set()
    for sid in ids:
        if sid in seen:
            raise InputError(p, "duplicate sample_id", sid)
        seen.add(sid)
    check_selection(p, conversations, ids, "conversation")
    wanted = set(conversations) if conversations is not None else None

    turns: list[Turn] = []
    questions: list[Question] = []
    stats = {"malformed": 0, "recovered": 0, "dropped": 0, "truncated_out": 0}
    for sid, sample in zip(ids, samples, strict=True):
        if wanted is not None and sid not in wanted:
            continue
        sessions = _load_sessions(p, sid, sample["conversation"])
        known = frozenset(t.dia_id for s in sessions for t in s.turns)
        qs = _load_questions(p, sid, sample["qa"], known, stats)
        if max_sessions is not None:
            sessions = sessions[:max_sessions]
            kept = {t.dia_id for s in sessions for t in s.turns}
            before = len(qs)
            qs = [q for q in qs if q.evidence and all(e in kept for e in q.evidence)]
            stats["truncated_out"] += before - len(qs)
        turns.extend(t for s in sessions for t in s.turns)
        questions.extend(qs)
    log.info(
        "%s: %d turns, %d questions; evidence: %d malformed ids, %d recovered, %d dropped; "
        "%d questions outside max_sessions=%s",
        p.name,
        len(turns),
        len(questions),
        stats["malformed"],
        stats["recovered"],
        stats["dropped"],
        stats["truncated_out"],
        max_sessions,
    )
    return turns_frame(turns), questions_frame(questions)


def load_locomo_speakers(
    path: str | Path, conversations: Sequence[str] | None = None
) -> pl.DataFrame:
    """schemas.CONVERSATIONS: each selected record's `speaker_a` and `speaker_b` as the file
    names them (null when a record has none), in file order. `conversations`: sample ids to
    keep (None = all). InputError for a malformed record or an unknown id; pure."""
    p = Path(path)
    data, _ = read_json_list(p)
    rows: list[dict[str, Any]] = []
    ids: list[str] = []
    for i, sample in enumerate(data):
        sample = require(p, sample, ("sample_id", "conversation"), f"record {i}", "sample")
        sid = require_str(p, sample["sample_id"], "sample_id", f"record {i}")
        ids.append(sid)
        conv = require(p, sample["conversation"], (), sid, "conversation")
        names = {k: (None if conv.get(k) is None else require_str(p, conv[k], k, sid))
                 for k in ("speaker_a", "speaker_b")}
        rows.append({"conv_id": sid, **names})
    check_selection(p, conversations, ids, "conversation")
    wanted = None if conversations is None else set(conversations)
    return schemas.frame([r for r in rows if wanted is None or r["conv_id"] in wanted],
                         schemas.CONVERSATIONS)


def _log_checksum(path: Path, raw: bytes) -> None:
    digest = hashlib.sha256(raw).hexdigest()
    if path.name == "locomo10.json" and digest != LOCOMO_SHA256:
        # Not fatal: an edited copy is a legitimate experiment, but scores are then not comparable.
        log.warning(
            "%s: sha256 %s is not the released LoCoMo file (%s)", path, digest, LOCOMO_SHA256
        )
    else:
        log.debug("%s: sha256 %s", path, digest)


def _load_sessions(path: Path, conv_id: str, conv: Any) -> list[_Session]:
    conv = require(path, conv, (), conv_id, "conversation")
    # Enumerate `session_<n>` keys, not the date keys: conv-26 has 35 date keys, 19 sessions.
    numbered: dict[int, str] = {}
    for key in conv:
        m = _SESSION_KEY.fullmatch(key)
        if m:
            n = int(m.group(1))
            if n in numbered:
                raise InputError(
                    path, f"session number {n} appears twice ({numbered[n]}, {key})", conv_id
                )
            numbered[n] = key
    if not numbered:
        raise InputError(path, "conversation has no sessions (no session_<n> keys)", conv_id)
    seen: dict[str, str] = {}
    return [_load_session(path, conv_id, n, numbered[n], conv, seen) for n in sorted(numbered)]


def _load_session(
    path: Path, conv_id: str, n: int, key: str, conv: Mapping[str, Any], seen: dict[str, str]
) -> _Session:
    record = f"{conv_id} {key}"
    items = conv[key]
    if not isinstance(items, list):
        raise InputError(
            path, f"session must be a list of turns, got {type(items).__name__}", record
        )
    if not items:
        raise InputError(path, "session has no turns", record)
    date_key = f"{key}_date_time"
    if date_key not in conv:
        raise InputError(path, f"missing {date_key}", record)
    time = parse_time(path, conv[date_key], DATE_FORMAT, record, "session date")

    parsed: list[RawTurn] = []
    for j, item in enumerate(items):
        where = f"{record} turn {j + 1}"
        item = require(path, item, ("speaker", "dia_id"), where, "turn")
        dia_id = require_str(path, item["dia_id"], "dia_id", where)
        where = f"{record} {dia_id}"
        speaker = require_str(path, item["speaker"], "speaker", where)
        text = item.get("text")
        text = "" if text is None else require_str(path, text, "text", where)
        caption = item.get("blip_caption")
        if caption is not None:
            caption = require_str(path, caption, "blip_caption", where).strip() or None
        if not text.strip() and caption is None:
            raise InputError(path, "turn has no text and no image caption", where)
        if dia_id in seen:
            raise InputError(path, f"duplicate dia_id (first in {seen[dia_id]})", where)
        seen[dia_id] = key
        parsed.append(RawTurn(dia_id, speaker, text, caption))

    turns = session_turns(conv_id, n, f"S{n}", time, parsed)
    return _Session(n, turns)


def _load_questions(
    path: Path, conv_id: str, qa: Any, known: frozenset[str], stats: dict[str, int]
) -> list[Question]:
    if not isinstance(qa, list):
        raise InputError(path, f"qa must be a list, got {type(qa).__name__}", conv_id)
    out: list[Question] = []
    for i, item in enumerate(qa):
        record = f"{conv_id} q{i}"
        item = require(path, item, ("question", "category", "evidence"), record, "qa item")
        question = require_str(path, item["question"], "question", record)
        category = item["category"]
        if isinstance(category, bool) or category not in LOCOMO_CATEGORIES:
            raise InputError(path, f"unknown category {category!r} (expected 1-5)", record)
        adversarial = item.get("adversarial_answer")
        if adversarial is not None:
            adversarial = gold_text(path, adversarial, "adversarial_answer", record)
        if "answer" in item and item["answer"] is not None:
            answer = gold_text(path, item["answer"], "answer", record)
        elif category == LOCOMO_ADVERSARIAL and adversarial is not None:
            answer = adversarial  # 444 of 446 cat-5 items have only adversarial_answer
        else:
            need = "answer or adversarial_answer" if category == LOCOMO_ADVERSARIAL else "answer"
            raise InputError(path, f"qa item is missing {need}", record)
        raw = item["evidence"]
        if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
            raise InputError(path, f"evidence must be a list of strings, got {raw!r}", record)
        ev = normalise_evidence(raw, known)
        stats["malformed"] += len(ev.recovered) + len(ev.unresolved)
        stats["recovered"] += len(ev.recovered)
        stats["dropped"] += len(ev.unresolved)
        for bad in ev.unresolved:
            log.warning("%s [%s]: dropped unresolvable evidence id %r", path.name, record, bad)
        out.append(
            Question(
                conv_id=conv_id,
                question_id=f"{conv_id}:q{i}",
                question=question,
                answer=answer,
                adversarial_answer=adversarial,
                category=category,
                category_name=LOCOMO_CATEGORIES[category],
                evidence=ev.ids,
                evidence_raw=tuple(raw),
                question_time=None,
                is_abstention=category == LOCOMO_ADVERSARIAL,
            )
        )
    return out
