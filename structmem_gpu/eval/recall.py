"""Evidence recall: the share of a question's evidence turns that its retrieved memory covers.

A question's evidence dia_ids become events `<conv_id>:<dia_id>`. A retrieved item covers:

- circuit "entries":   the event of the entry (`entries.event_id`);
- circuit "syntheses": the events of the synthesis's buffer and context entries;
- circuit "turns":     the item itself (its item_id is an event_id);
- any row with an `event_ids` list (SEEM facts/frames, graph relations): those events;
- any other circuit:   the item's events when its id is a known entry or synthesis id, else
                       nothing (counted in `EvidenceIndex.unresolved`).

Recall is None when the question has no resolvable evidence (4 LoCoMo cat-3 questions have
none) or the run has no retrievals table (full_context): LoCoMo's own code scores those 1.0,
which we do not copy (docs/evaluation.md "Evidence recall").

    >>> idx = EvidenceIndex.build(entries=None, syntheses=None)
    >>> cover = idx.coverage(retrievals_of_q=[("turns", "c1:D1:2")])
    >>> evidence_recall(["D1:2", "D1:3"], "c1", cover)
    0.5
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

log = logging.getLogger(__name__)

TURN_CIRCUITS = frozenset({"turns"})  # circuits whose item_id is an event_id


@dataclass
class EvidenceIndex:
    """item id -> the events it covers, built once per judge stage."""

    item_events: Mapping[str, frozenset[str]]
    unresolved: int = 0  # retrieved items whose events could not be determined
    _warned: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, entries: pl.DataFrame | None, syntheses: pl.DataFrame | None) -> EvidenceIndex:
        events: dict[str, frozenset[str]] = {}
        entry_event: dict[str, str] = {}
        if entries is not None and entries.height:
            for eid, ev in entries.select("entry_id", "event_id").iter_rows():
                entry_event[eid] = ev
                events[eid] = frozenset([ev])
        if syntheses is not None and syntheses.height:
            cols = syntheses.select("synth_id", "buffer_entry_ids", "context_entry_ids")
            for sid, buffer_ids, context_ids in cols.iter_rows():
                ids = list(buffer_ids or []) + list(context_ids or [])
                events[sid] = frozenset(entry_event[i] for i in ids if i in entry_event)
        return cls(item_events=events)

    def coverage(self, retrievals_of_q: Iterable[tuple[str, str] | tuple[str, str, Sequence[str] | None]]) -> set[str]:
        """Events covered by one question's retrieved (circuit, item_id[, event_ids]) rows."""
        covered: set[str] = set()
        for circuit, item_id, *rest in retrievals_of_q:
            carried = rest[0] if rest else None
            if carried is not None:
                covered.update(carried)
            elif circuit in TURN_CIRCUITS:
                covered.add(item_id)
            elif item_id in self.item_events:
                covered |= self.item_events[item_id]
            else:
                self.unresolved += 1
                if circuit not in self._warned:
                    self._warned.add(circuit)
                    log.warning(
                        "evidence recall: circuit %r item %r maps to no entry or synthesis",
                        circuit,
                        item_id,
                    )
        return covered


def evidence_recall(
    evidence: Sequence[str] | None, conv_id: str, covered: set[str]
) -> float | None:
    """Share of evidence dia_ids whose event `<conv_id>:<dia_id>` is covered; None: no evidence."""
    ids = [d for d in (evidence or []) if d]
    if not ids:
        return None
    return sum(f"{conv_id}:{d}" in covered for d in ids) / len(ids)


def recall_by_question(
    questions: pl.DataFrame,
    retrievals: pl.DataFrame | None,
    entries: pl.DataFrame | None,
    syntheses: pl.DataFrame | None,
) -> tuple[dict[str, float | None], int]:
    """question_id -> evidence recall (None = excluded) and the count of unresolved items.

    Without a retrievals table every question maps to None (no memory was retrieved).
    """
    qids = questions["question_id"].to_list()
    if retrievals is None:
        return {q: None for q in qids}, 0
    index = EvidenceIndex.build(entries, syntheses)
    by_q: dict[str, list[tuple[str, str, Sequence[str] | None]]] = defaultdict(list)
    if "event_ids" not in retrievals.columns:  # methods whose items map through entries/syntheses
        retrievals = retrievals.with_columns(event_ids=pl.lit(None, dtype=pl.List(pl.String())))
    cols = retrievals.select("question_id", "circuit", "item_id", "event_ids")
    for qid, circuit, item, events in cols.iter_rows():
        by_q[qid].append((circuit, item, events))
    out: dict[str, float | None] = {}
    for qid, conv, evidence in questions.select("question_id", "conv_id", "evidence").iter_rows():
        out[qid] = evidence_recall(evidence, conv, index.coverage(by_q.get(qid, ())))
    return out, index.unresolved
