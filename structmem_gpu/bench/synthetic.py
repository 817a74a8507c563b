"""Synthetic LoCoMo-format conversations of any size, for the scale benchmark.

    python jobs/bench.py scale --sizes 10,100,1000

    spec = SyntheticSpec(conversations=100, sessions=4, turns_per_session=6)
    path = write_locomo(spec, Path("synthetic.json"))
    turns, questions = load_benchmark("locomo", path, None, None)     # 2,400 turns, 200 questions

Deterministic: the same spec gives byte-identical files (text, dates and questions come from
a hash of (seed, conversation, session, turn), never from a global random state). The text is
invented, templated English of realistic length (~20 words a turn), so prompts and embeddings
cost what real turns cost. One record:

    {"sample_id": "syn-0003",
     "conversation": {"speaker_a": "Mara", "speaker_b": "Jonas",
                      "session_1_date_time": "4:30 pm on 12 January, 2023",
                      "session_1": [{"speaker": "Mara", "dia_id": "D1:1", "text":
                                     "Jonas, yesterday I went kayaking at the old harbour ..."}]},
     "qa": [{"question": "Where did Mara go kayaking?", "answer": "the old harbour",
             "evidence": ["D1:1"], "category": 4}]}

Haystack mode (`shared_pool=P`): every conversation draws its sessions from one pool of P
sessions (same turns, same date, same speakers), the way LongMemEval haystacks share
sessions; equal sessions get equal `session_hash` and identical extraction prompts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

NAMES = (
    "Mara",
    "Jonas",
    "Ines",
    "Tariq",
    "Lena",
    "Tomas",
    "Yuki",
    "Priya",
    "Omar",
    "Sofia",
    "Kwame",
    "Elena",
    "Ravi",
    "Hana",
    "Felix",
    "Nadia",
)
ACTIVITIES = (
    "went kayaking",
    "started a pottery class",
    "ran a half marathon",
    "adopted a cat",
    "visited my grandmother",
    "fixed an old bicycle",
    "joined a book club",
    "planted tomatoes",
    "painted the kitchen",
    "tried a new ramen place",
    "volunteered at the shelter",
    "went to a jazz concert",
    "started learning Spanish",
    "baked sourdough bread",
    "hiked a mountain trail",
    "moved to a new flat",
)
PLACES = (
    "the old harbour",
    "the community centre",
    "Riverside Park",
    "the city library",
    "a small cafe downtown",
    "the farmers market",
    "the lake house",
    "the climbing gym",
    "my sister's place",
    "the art museum",
    "the north beach",
    "the train station",
)
COMPANIONS = (
    "my brother",
    "two colleagues",
    "an old school friend",
    "my neighbour",
    "the kids",
    "my partner",
    "a group from work",
    "my cousin",
)
FEELINGS = (
    "honestly exhausting but worth it",
    "more fun than I expected",
    "a bit scary at first",
    "really relaxing",
    "chaotic in the best way",
    "something I want to repeat soon",
)
REPLIES = (
    "That sounds wonderful, {a}! How did {c} like it?",
    "Wow, {a}, I remember you wanted to do that for ages. Was it at {p}?",
    "I am so proud of you, {a}. Tell me more about {p}!",
    "Ha, typical {a}. Did you take any photos at {p}?",
    "That reminds me of last spring when we talked about {p}. How was it?",
)
WHEN = ("yesterday", "last weekend", "on Saturday", "this morning", "two days ago", "last Friday")
CAPTIONS = (
    "a photo of a kayak on calm water",
    "a photo of a clay bowl on a wheel",
    "a photo of a finisher medal",
    "a photo of a grey cat on a sofa",
    "a photo of a trail sign in the mountains",
    "a photo of fresh bread on a table",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
HAYSTACK_SPEAKERS = ("Alex", "Sam")
BASE_TIME = datetime(2023, 1, 2, 9, 0)


@dataclass(frozen=True)
class SyntheticSpec:
    conversations: int
    sessions: int = 4  # sessions per conversation
    turns_per_session: int = 6
    questions_per_conversation: int = 2  # categories cycle 4, 2, 1, 3 (headline categories)
    shared_pool: int | None = None  # haystack mode: sessions drawn from a pool of this many
    image_every: int = 5  # every k-th turn shares an image (blip_caption); 0 = none
    seed: int = 0

    def __post_init__(self) -> None:
        if self.conversations < 1 or self.sessions < 1 or self.turns_per_session < 1:
            raise ValueError(f"synthetic spec needs >= 1 conversation, session and turn: {self}")
        if self.shared_pool is not None and self.shared_pool < self.sessions:
            raise ValueError(f"shared_pool={self.shared_pool} < sessions={self.sessions}")


def _h(*parts: object) -> int:
    """Stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


def _pick(options: tuple[str, ...], *key: object) -> str:
    return options[_h(*key) % len(options)]


def locomo_date(t: datetime) -> str:
    """LoCoMo's session date format: '4:30 pm on 12 January, 2023'."""
    hour = t.hour % 12 or 12
    ampm = "am" if t.hour < 12 else "pm"
    return f"{hour}:{t.minute:02d} {ampm} on {t.day} {MONTHS[t.month - 1]}, {t.year}"


@dataclass(frozen=True)
class _Turn:
    speaker: str
    text: str
    caption: str | None
    place: str  # what the opening turn is about (questions ask about it)
    activity: str


def _session_turns(
    key: tuple[object, ...], a: str, b: str, n: int, image_every: int
) -> list[_Turn]:
    """n alternating turns: each opener tells news, each reply reacts to it."""
    out: list[_Turn] = []
    for j in range(n):
        speaker, other = (a, b) if j % 2 == 0 else (b, a)
        act, place = _pick(ACTIVITIES, *key, j, "act"), _pick(PLACES, *key, j, "place")
        comp, feel = _pick(COMPANIONS, *key, j, "comp"), _pick(FEELINGS, *key, j, "feel")
        if j % 2 == 0:
            text = (
                f"{other}, {_pick(WHEN, *key, j, 'when')} I {act} at {place} with {comp}. "
                f"It was {feel}."
            )
        else:
            prev = out[-1]
            text = _pick(REPLIES, *key, j, "reply").format(a=other, c=comp, p=prev.place)
            act, place = prev.activity, prev.place
        caption = None
        if image_every and (_h(*key, j, "img") % image_every) == 0:
            caption = _pick(CAPTIONS, *key, j, "cap")
        out.append(_Turn(speaker, text, caption, place, act))
    return out


def _pool_session(spec: SyntheticSpec, p: int) -> tuple[datetime, list[_Turn]]:
    t = BASE_TIME + timedelta(days=3 * p, minutes=37 * (_h(spec.seed, "pool", p) % 20))
    a, b = HAYSTACK_SPEAKERS
    return t, _session_turns((spec.seed, "pool", p), a, b, spec.turns_per_session, spec.image_every)


def _conversation(spec: SyntheticSpec, c: int) -> dict[str, Any]:
    conv_id = f"syn-{c:04d}"
    if spec.shared_pool:
        a, b = HAYSTACK_SPEAKERS
        # A deterministic subset of the pool, in pool (= time) order.
        picks = sorted(range(spec.shared_pool), key=lambda p: _h(spec.seed, "draw", c, p))
        sessions = [_pool_session(spec, p) for p in sorted(picks[: spec.sessions])]
    else:
        a = NAMES[_h(spec.seed, c, "a") % len(NAMES)]
        b = NAMES[(NAMES.index(a) + 1 + _h(spec.seed, c, "b") % (len(NAMES) - 1)) % len(NAMES)]
        start = BASE_TIME + timedelta(days=_h(spec.seed, c, "start") % 200)
        sessions = []
        for s in range(spec.sessions):
            # Sessions 1-9 days apart (LoCoMo: >1 day, so one consolidation window each).
            start += timedelta(
                days=1 + _h(spec.seed, c, s, "gap") % 9,
                minutes=13 * (_h(spec.seed, c, s, "min") % 30),
            )
            turns = _session_turns(
                (spec.seed, c, s), a, b, spec.turns_per_session, spec.image_every
            )
            sessions.append((start, turns))
    conversation: dict[str, Any] = {"speaker_a": a, "speaker_b": b}
    for s, (t, turns) in enumerate(sessions, start=1):
        conversation[f"session_{s}_date_time"] = locomo_date(t)
        items = []
        for j, turn in enumerate(turns, start=1):
            item: dict[str, Any] = {
                "speaker": turn.speaker,
                "dia_id": f"D{s}:{j}",
                "text": turn.text,
            }
            if turn.caption:
                item["img_url"] = [f"https://example.org/synthetic/{conv_id}/D{s}-{j}.jpg"]
                item["blip_caption"] = turn.caption
            items.append(item)
        conversation[f"session_{s}"] = items
    return {"sample_id": conv_id, "conversation": conversation, "qa": _questions(spec, c, sessions)}


def _questions(
    spec: SyntheticSpec, c: int, sessions: list[tuple[datetime, list[_Turn]]]
) -> list[dict[str, Any]]:
    cats = (4, 2, 1, 3)
    out = []
    for q in range(spec.questions_per_conversation):
        s = _h(spec.seed, c, q, "qs") % len(sessions)
        t, turns = sessions[s]
        j = 2 * (_h(spec.seed, c, q, "qt") % ((len(turns) + 1) // 2))  # an opening turn
        turn, cat = turns[j], cats[q % len(cats)]
        evidence = [f"D{s + 1}:{j + 1}"]
        if cat == 2:
            item = {
                "question": f"When did {turn.speaker} say they {turn.activity}?",
                "answer": f"{t.day} {MONTHS[t.month - 1]} {t.year}",
            }
        elif cat == 1 and j + 1 < len(turns):
            item = {
                "question": f"Who reacted when {turn.speaker} {turn.activity}?",
                "answer": turns[j + 1].speaker,
            }
            evidence.append(f"D{s + 1}:{j + 2}")
        else:
            item = {
                "question": f"Where did {turn.speaker} say they {turn.activity}?",
                "answer": turn.place,
            }
        out.append({**item, "evidence": evidence, "category": cat})
    return out


def generate_locomo(spec: SyntheticSpec) -> list[dict[str, Any]]:
    """The records of a LoCoMo-format file (a JSON list), one per conversation."""
    return [_conversation(spec, c) for c in range(spec.conversations)]


def write_locomo(spec: SyntheticSpec, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(generate_locomo(spec), indent=1), encoding="utf-8")
    return path


def unique_pool_sessions(spec: SyntheticSpec) -> int:
    """Distinct sessions a haystack spec uses (= spec.conversations * sessions without a pool)."""
    if not spec.shared_pool:
        return spec.conversations * spec.sessions
    used: set[int] = set()
    for c in range(spec.conversations):
        picks = sorted(range(spec.shared_pool), key=lambda p: _h(spec.seed, "draw", c, p))
        used.update(picks[: spec.sessions])
    return len(used)
