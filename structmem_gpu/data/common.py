"""Row types and helpers shared by the benchmark loaders.

Both loaders build `Turn` and `Question` rows (frozen: a loader never patches a row after
building it) and turn them into frames with exactly `schemas.TURNS` / `schemas.QUESTIONS`.
One turn row of the bundled sample, as `Turn`:

    Turn(conv_id="sample-1", session_index=2, session_id="S2", session_hash="…",
         session_time=datetime(2024, 3, 17, 19, 5), turn_index=3, dia_id="D2:4",
         event_id="sample-1:D2:4", speaker="Tomas", text="Here he is on his first walk!",
         image_caption="a photo of a small beagle puppy …", has_answer=None)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.core.errors import ConfigError, InputError
from structmem_gpu.core.hashing import stable_hash


@dataclass(frozen=True, slots=True)
class Turn:
    conv_id: str
    session_index: int  # 1-based
    session_id: str
    session_hash: str
    session_time: datetime
    turn_index: int  # 0-based inside the session
    dia_id: str
    event_id: str
    speaker: str
    text: str
    image_caption: str | None
    has_answer: bool | None  # LongMemEval evidence flag as in the file; None when absent


@dataclass(frozen=True, slots=True)
class Question:
    conv_id: str
    question_id: str
    question: str
    answer: str | None
    adversarial_answer: str | None
    category: int
    category_name: str
    evidence: tuple[str, ...]  # normalised dia_ids that resolve to turns
    evidence_raw: tuple[str, ...]  # the file's list, unchanged (str()'d)
    question_time: datetime | None
    is_abstention: bool


_TURN_FIELDS = tuple(f.name for f in fields(Turn))
_QUESTION_FIELDS = tuple(f.name for f in fields(Question))
assert _TURN_FIELDS == tuple(schemas.TURNS), "Turn fields drifted from schemas.TURNS"
assert _QUESTION_FIELDS == tuple(schemas.QUESTIONS), (
    "Question fields drifted from schemas.QUESTIONS"
)


def display_text(text: str, caption: str | None) -> str:
    """The text every prompt shows for a turn: `<text> [image: <caption>]` for image turns.

    One function so extraction, full-context and answer prompts render images identically.
    """
    if not caption:
        return text
    return f"{text} [image: {caption}]" if text else f"[image: {caption}]"


def session_hash(turns: Sequence[tuple[str, str, str | None]], time: datetime) -> str:
    """Content hash of a session: its (speaker, text, caption) turns and its date.

    Ids and file positions are left out on purpose, so the same LongMemEval session appearing
    in several haystacks (same turns, same date) gets the same hash and its memory can be shared.
    """
    return stable_hash("session", [list(t) for t in turns], time.isoformat())


@dataclass(frozen=True, slots=True)
class RawTurn:
    """One validated turn of a session, before ids and the session hash are attached."""

    dia_id: str
    speaker: str
    text: str
    image_caption: str | None = None
    has_answer: bool | None = None


def session_turns(
    conv_id: str, session_index: int, session_id: str, time: datetime, raw: Sequence[RawTurn]
) -> tuple[Turn, ...]:
    """The session's Turn records (both loaders): ids, position and the content hash."""
    h = session_hash([(r.speaker, r.text, r.image_caption) for r in raw], time)
    return tuple(
        Turn(
            conv_id=conv_id,
            session_index=session_index,
            session_id=session_id,
            session_hash=h,
            session_time=time,
            turn_index=j,
            dia_id=r.dia_id,
            event_id=f"{conv_id}:{r.dia_id}",
            speaker=r.speaker,
            text=r.text,
            image_caption=r.image_caption,
            has_answer=r.has_answer,
        )
        for j, r in enumerate(raw)
    )


def turns_frame(turns: Iterable[Turn]) -> pl.DataFrame:
    # Column lists, not dicts: a few times faster than one dict per row for 250k-turn files.
    cols: dict[str, list[Any]] = {name: [] for name in _TURN_FIELDS}
    for t in turns:
        for name in _TURN_FIELDS:
            cols[name].append(getattr(t, name))
    return pl.DataFrame(cols, schema=dict(schemas.TURNS))


def questions_frame(questions: Iterable[Question]) -> pl.DataFrame:
    cols: dict[str, list[Any]] = {name: [] for name in _QUESTION_FIELDS}
    for q in questions:
        for name in _QUESTION_FIELDS:
            value = getattr(q, name)
            cols[name].append(list(value) if isinstance(value, tuple) else value)
    return pl.DataFrame(cols, schema=dict(schemas.QUESTIONS))


def read_json_list(path: str | Path) -> tuple[list[Any], bytes]:
    """The file's top-level JSON list and its raw bytes; InputError for every way it can fail."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(p, "file not found") from None
    except OSError as exc:
        raise InputError(p, f"cannot read file: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(p, f"invalid JSON: {exc}") from None
    if not isinstance(data, list):
        raise InputError(p, f"top level must be a JSON list of records, got {type(data).__name__}")
    return data, raw


def require(
    path: Path, obj: Any, keys: Sequence[str], record: str, kind: str = "record"
) -> Mapping[str, Any]:
    """`obj` as a mapping that has every key in `keys`, else InputError naming the record."""
    if not isinstance(obj, Mapping):
        raise InputError(path, f"{kind} must be a JSON object, got {type(obj).__name__}", record)
    missing = [k for k in keys if k not in obj]
    if missing:
        raise InputError(path, f"{kind} is missing required key(s) {missing}", record)
    return obj


def require_str(path: Path, value: Any, what: str, record: str) -> str:
    if not isinstance(value, str):
        raise InputError(path, f"{what} must be a string, got {type(value).__name__}", record)
    return value


def gold_text(path: Path, value: Any, what: str, record: str) -> str:
    """A gold answer as a string: LoCoMo has 6 integer golds (2022 ×4, 2, 3) and both official
    scorers str() them, so the column is always a string."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise InputError(path, f"{what} must be a string or number, got {value!r}", record)


def parse_time(path: Path, value: Any, fmt: str, record: str, what: str) -> datetime:
    if not isinstance(value, str):
        raise InputError(path, f"{what} must be a string, got {value!r}", record)
    try:
        return datetime.strptime(value.strip(), fmt)
    except ValueError:
        raise InputError(
            path, f"unparseable {what} {value!r} (expected format {fmt!r})", record
        ) from None


def check_selection(
    path: Path, requested: Sequence[str] | None, available: Sequence[str], kind: str
) -> None:
    """Fail when a requested conversation / question id is not in the file (a typo in config)."""
    if requested is None:
        return
    unknown = sorted(set(requested) - set(available))
    if unknown:
        shown = ", ".join(list(available)[:12]) + (" …" if len(available) > 12 else "")
        raise InputError(path, f"requested {kind}(s) {unknown} not in file; available: {shown}")


def check_max_sessions(max_sessions: int | None) -> None:
    if max_sessions is not None and (isinstance(max_sessions, bool) or max_sessions < 1):
        raise ConfigError(f"max_sessions must be a positive integer or null, got {max_sessions!r}")
