"""Our reader over a baseline system's hits (structmem_gpu/systems/answer.py): memories grouped
by whose they are with their dates, relations and entities undated, a retrieved context block
as it is, and the abstention rule of every memory reader."""

from __future__ import annotations

import polars as pl

from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED
from structmem_gpu.systems.answer import SYSTEM, render
from structmem_gpu.systems.stages import SYSTEM_HITS


def _hits(rows):
    return pl.DataFrame(rows, schema=SYSTEM_HITS, orient="row")


def test_memories_by_owner_dated_relations_and_context():
    hits = _hits([
        ("q", "c", 0, "m1", "Caroline", "memory", "Researches adoption agencies", "2023-05-08T13:56:00", 0.9),
        ("q", "c", 1, "m2", "Melanie", "memory", "Painted a sunset", "2023-05-08", 0.8),
        ("q", "c", 2, "r1", None, "relation", "caroline -- researches -- adoption", None, None),
        ("q", "c", 3, "x", None, "context", "-----Entities-----\nCaroline: a person", None, None),
    ])
    text = render(hits)
    assert "Memories of Caroline:\n- [2023-05-08] Researches adoption agencies" in text
    assert "Memories of Melanie:\n- [2023-05-08] Painted a sunset" in text
    assert "Relations:\n- caroline -- researches -- adoption" in text
    assert "Retrieved context:\n-----Entities-----\nCaroline: a person" in text
    assert render(hits.clear()) == "(no memories retrieved)"
    assert NOT_MENTIONED in SYSTEM


def test_own_reader_sends_the_systems_prompt_whole():
    """answer.prompt=...:own_reader: each question's prompt from system_readers as one system
    message, the whole reply the prediction; a question without one stops the stage."""
    import pytest

    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.eval.answer import AnswerInputs
    from structmem_gpu.systems.answer import own_reader
    from structmem_gpu.systems.stages import SYSTEM_READERS
    from tests.fixtures.pipeline import job_with

    job = job_with(overrides=["method=lightmem_official", "llm=scripted"])
    assert job.select("answer.prompt") == "structmem_gpu.systems.answer:own_reader"
    questions = pl.DataFrame({"question_id": ["q1", "q2"], "conv_id": ["c", "c"],
                              "question": ["Where?", "When?"], "question_time": [None, None]})
    readers = pl.DataFrame([("q2", "c", "Memories ... Question: When?"),
                            ("q1", "c", "Memories ... Question: Where?")],
                           schema=SYSTEM_READERS, orient="row")
    prompts = own_reader(AnswerInputs(job, questions, {"system_readers": readers}))
    assert [(m.role, m.content) for m in prompts["q1"].messages] == [
        ("system", "Memories ... Question: Where?")]
    assert prompts["q2"].raw_reply and not prompts["q2"].reasoned_reply
    with pytest.raises(ConfigError, match="no reader prompt for 1 question.*first: q2"):
        own_reader(AnswerInputs(job, questions, {
            "system_readers": readers.filter(pl.col("question_id") == "q1")}))
