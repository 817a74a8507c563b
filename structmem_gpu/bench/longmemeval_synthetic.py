"""Synthetic LongMemEval-format files of LongMemEval-M's shape (haystack mode of synthetic.py).

    python jobs/bench.py lme-load --lme-questions 100,500     # writes, loads, measures RSS

    spec = HaystackFileSpec(questions=100, sessions=500, pool=20_000, turns_per_session=10)
    write_longmemeval(spec, Path("m_shaped.json"))   # ~280 MB, 100 questions

LongMemEval-M gives each of its 500 questions a haystack of ~500 sessions drawn from one
shared pool, plus the question's own evidence session(s). Here: each question's haystack is
its own evidence session plus `sessions - 1` sessions drawn (seeded, without replacement) from
a pool of `pool` sessions. A pool session has the same id and turns in every haystack that
draws it; its date depends on `dates`:

- `per_haystack` (default): as LongMemEval's own recipe builds single-session histories
  (data/custom_history/sample_haystack_and_timestamp.py: the haystack shuffled, then
  `get_random_same_day_timestamps(len(haystack) + 1)` on a day drawn from 2023/05/20-30, the
  last timestamp being the question date), each haystack draws its dates afresh, so a pool
  session carries another date in nearly every haystack that draws it;
- `fixed`: the earlier shortcut, one date per pool session everywhere (haystacks in pool
  order), so the loader's session_hash (turns + date) finds it again and stores it once. Turns alternate user/assistant;
user turns tell news (synthetic.py's templates), assistant turns answer at LongMemEval's
length (~1 kB; the real M file averages ~550 characters a turn over both roles), so a
100-question file is ~280 MB like the issue's measurement. The evidence turn (the user's first
turn of the evidence session) carries `has_answer: true`; the question asks where they did it.

Deterministic: the same spec gives byte-identical files (seeded hashes, no global state). The
file is written one record at a time, so writing the 500-question file (~1.4 GB) holds only
the pool's text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from structmem_gpu.bench.synthetic import HAYSTACK_SPEAKERS, _h, _pick, _session_turns, _Turn

__all__ = ["HaystackFileSpec", "write_longmemeval"]

DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"  # LongMemEval's: "2023/04/10 (Mon) 23:07"
BASE_TIME = datetime(2022, 1, 3, 8, 0)
DATES = ("per_haystack", "fixed")
# The recipe's random_date(2023, 2023, 5, 5, 20, 30): the day of a haystack's timestamps.
RECIPE_FIRST_DAY, RECIPE_DAYS = datetime(2023, 5, 20), 11
ADVICE = (
    "A good first step is to write down what you want to get out of it before you start.",
    "Many people find it easier to keep going when they pick a fixed day of the week for it.",
    "If the weather turns, an indoor alternative nearby keeps the plan from falling apart.",
    "Budget a little extra time for travel, since weekend traffic can be unpredictable.",
    "It helps to bring water, a light snack and a charged phone, just in case.",
    "Keeping a short journal afterwards makes it easier to notice your own progress.",
    "Local community boards often list groups that meet regularly for exactly this.",
    "Try not to compare yourself with experienced people; everyone started somewhere.",
    "Photos are a nice way to remember the day, but do take a moment without the camera.",
    "Inviting a friend along usually makes the second time much easier to commit to.",
    "Check the opening hours online, because they often change with the seasons.",
    "A simple checklist the evening before saves a lot of stress in the morning.",
    "If you feel sore the next day, gentle stretching and rest are usually enough.",
    "Setting a small, concrete goal for next month keeps the momentum going.",
)


@dataclass(frozen=True)
class HaystackFileSpec:
    questions: int
    sessions: int = 500  # haystack sessions per question (1 evidence + sessions-1 from the pool)
    pool: int = 20_000  # distinct shared sessions the haystacks draw from
    turns_per_session: int = 10
    seed: int = 0
    # per_haystack = LongMemEval's recipe (dates drawn per haystack); fixed = one date per
    # pool session in every haystack (the earlier shortcut, kept as a named variant)
    dates: str = "per_haystack"

    def __post_init__(self) -> None:
        if self.dates not in DATES:
            raise ValueError(f"dates={self.dates!r}: expected one of {DATES}")
        if self.questions < 1 or self.sessions < 1 or self.turns_per_session < 1:
            raise ValueError(f"haystack spec needs >= 1 question, session and turn: {self}")
        if self.pool < self.sessions - 1:
            raise ValueError(f"pool={self.pool} < sessions-1={self.sessions - 1}")


def _turns(spec: HaystackFileSpec, key: tuple[object, ...], answer: bool
           ) -> tuple[list[dict[str, object]], list[_Turn]]:
    a, _ = HAYSTACK_SPEAKERS
    raw = _session_turns(key, *HAYSTACK_SPEAKERS, spec.turns_per_session, image_every=0)
    out: list[dict[str, object]] = []
    for j, t in enumerate(raw):
        role = "user" if t.speaker == a else "assistant"
        text = t.text
        if role == "assistant":
            n = 8 + _h(*key, j, "len") % 7  # 8-14 sentences, ~1 kB
            text += " " + " ".join(_pick(ADVICE, *key, j, k) for k in range(n))
        turn: dict[str, object] = {"role": role, "content": text}
        if answer:
            turn["has_answer"] = j == 0
        out.append(turn)
    return out, raw


def _pool_time(spec: HaystackFileSpec, p: int) -> datetime:
    # ~4 sessions a day, in pool order, so a haystack sorted by pool index is in time order.
    return BASE_TIME + timedelta(hours=6 * p, minutes=_h(spec.seed, "pt", p) % 300)


def _same_day_times(rng: random.Random, n: int) -> list[datetime]:
    """The recipe's get_random_same_day_timestamps(n): n sorted random times of one day drawn
    from 2023/05/20-30 (seeded here, where the recipe uses the global `random`)."""
    day = RECIPE_FIRST_DAY + timedelta(days=rng.randrange(RECIPE_DAYS))
    return sorted(day + timedelta(seconds=rng.randint(0, 86399)) for _ in range(n))


def write_longmemeval(spec: HaystackFileSpec, path: Path) -> Path:
    """Write the file (a JSON list, one record per question); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pool_json: dict[int, str] = {}  # pool index -> its turns as JSON text (written verbatim)

    def pool_session(p: int) -> str:
        if p not in pool_json:
            pool_json[p] = json.dumps(_turns(spec, (spec.seed, "lme-pool", p), False)[0])
        return pool_json[p]

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[")
        for q in range(spec.questions):
            rng = random.Random(_h(spec.seed, "lme-draw", q))
            picks = rng.sample(range(spec.pool), spec.sessions - 1)
            qid = f"syn_m_{q:05d}"
            # The evidence session sits at a seeded place in the haystack.
            at = rng.randrange(spec.sessions)
            ans_turns, ans_raw = _turns(spec, (spec.seed, "lme-answer", q), True)
            ans_id = f"answer_{qid}_1"
            if spec.dates == "fixed":
                picks.sort()  # pool order is time order
                slot_time = _pool_time(spec, picks[at - 1]) if at else BASE_TIME
                dates = [_pool_time(spec, p) for p in picks]
                dates.insert(at, slot_time + timedelta(minutes=1 + rng.randrange(200)))
                asked = max(dates) + timedelta(days=1)
            else:
                dates = _same_day_times(rng, spec.sessions + 1)
                asked = dates.pop()  # the recipe's question date: the last timestamp
            ids = [f"pool_{p:06d}" for p in picks]
            ids.insert(at, ans_id)
            head = {
                "question_id": qid,
                "question_type": "single-session-user",
                "question": f"Where did I say I {ans_raw[0].activity}?",
                "answer": ans_raw[0].place,
                "question_date": asked.strftime(DATE_FORMAT),
                "haystack_session_ids": ids,
                "haystack_dates": [d.strftime(DATE_FORMAT) for d in dates],
                "answer_session_ids": [ans_id],
            }
            sessions = [pool_session(p) for p in picks]
            sessions.insert(at, json.dumps(ans_turns))
            body = json.dumps(head)[:-1] + ', "haystack_sessions": [' + ", ".join(sessions) + "]}"
            f.write(("\n" if q == 0 else ",\n") + body)
        f.write("\n]\n")
    tmp.replace(path)
    return path

