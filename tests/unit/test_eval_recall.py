"""Evidence recall on a hand-built run: entries, syntheses (buffer + context) and turn items."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.eval.recall import EvidenceIndex, evidence_recall, recall_by_question

T = datetime(2023, 5, 8, 13, 56)


def _entries() -> pl.DataFrame:
    rows = [
        {
            "entry_id": eid,
            "conv_id": "c1",
            "event_id": f"c1:{dia}",
            "dia_id": dia,
            "session_index": 1,
            "turn_index": i,
            "event_time": T,
            "speaker": "A",
            "kind": "fact",
            "text": f"fact {eid}",
            "request_id": "r",
            "prompt_version": "p",
            "model": "m",
        }
        for i, (eid, dia) in enumerate(
            [("e1", "D1:1"), ("e2", "D1:2"), ("e3", "D1:3"), ("e4", "D2:1")]
        )
    ]
    return schemas.frame(rows, schemas.ENTRIES)


def _syntheses() -> pl.DataFrame:
    return schemas.frame(
        [
            {
                "synth_id": "s1",
                "conv_id": "c1",
                "window_index": 0,
                "window_start": T,
                "window_end": T,
                "text": "summary",
                "buffer_entry_ids": ["e3"],
                "seed_entry_ids": ["e4"],
                "context_entry_ids": ["e4"],
                "request_id": "r",
                "prompt_version": "p",
                "parse_ok": True,
            }
        ],
        schemas.SYNTHESES,
    )


def _questions() -> pl.DataFrame:
    base = {
        "conv_id": "c1",
        "question": "?",
        "answer": "x",
        "adversarial_answer": None,
        "category": 4,
        "category_name": "single-hop",
        "evidence_raw": [],
        "question_time": None,
        "is_abstention": False,
    }
    return schemas.frame(
        [
            {
                **base,
                "question_id": "q1",
                "evidence": ["D1:1", "D1:2", "D1:3", "D2:1"],
            },  # entry + synthesis
            {**base, "question_id": "q2", "evidence": ["D1:2", "D9:9"]},  # turn circuit: 1 of 2
            {**base, "question_id": "q3", "evidence": []},  # no evidence -> excluded (None)
            {**base, "question_id": "q4", "evidence": ["D1:1"]},  # nothing retrieved -> 0
        ],
        schemas.QUESTIONS,
    )


def _retrievals() -> pl.DataFrame:
    rows = [
        ("q1", "entries", "e1"),
        ("q1", "syntheses", "s1"),
        ("q2", "turns", "c1:D1:2"),
        ("q3", "entries", "e1"),
        ("q1", "entries", "unknown-id"),
    ]
    return schemas.frame(
        [
            {
                "question_id": q,
                "conv_id": "c1",
                "circuit": c,
                "rank": i,
                "item_id": it,
                "score": 1.0,
            }
            for i, (q, c, it) in enumerate(rows)
        ],
        schemas.RETRIEVALS,
    )


def test_hand_built_case() -> None:
    recall, unresolved = recall_by_question(_questions(), _retrievals(), _entries(), _syntheses())
    # q1: D1:1 (entry e1) + D1:3 (synthesis buffer e3) + D2:1 (synthesis context e4); D1:2 missing.
    assert recall == {"q1": 0.75, "q2": 0.5, "q3": None, "q4": 0.0}
    assert unresolved == 1  # "unknown-id" is counted, not silently ignored


def test_no_retrievals_table_means_excluded() -> None:
    recall, _ = recall_by_question(_questions(), None, _entries(), _syntheses())
    assert set(recall.values()) == {None}


def test_synthesis_covers_buffer_and_context_events() -> None:
    idx = EvidenceIndex.build(_entries(), _syntheses())
    assert idx.item_events["s1"] == frozenset({"c1:D1:3", "c1:D2:1"})
    assert evidence_recall(["D1:3"], "c1", idx.coverage([("syntheses", "s1")])) == 1.0
    assert (
        evidence_recall(["D1:3"], "c2", idx.coverage([("syntheses", "s1")])) == 0.0
    )  # other conversation


def test_rows_carrying_event_ids_cover_those_events() -> None:
    # SEEM facts/frames and graph relations carry their provenance events on the row.
    import polars as pl

    from structmem_gpu.eval.recall import recall_by_question

    questions = pl.DataFrame({"question_id": ["q1"], "conv_id": ["c"], "evidence": [["D1:1", "D1:2"]]})
    retrievals = pl.DataFrame({"question_id": ["q1", "q1"], "circuit": ["frames", "facts"],
                               "item_id": ["fr1", "fa1"], "event_ids": [["c:D1:1"], ["c:D9:9"]]})
    recall, unresolved = recall_by_question(questions, retrievals, None, None)
    assert recall == {"q1": 0.5} and unresolved == 0
