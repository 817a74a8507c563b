"""One Polars schema constant per table of the run directory (docs/design.md "Table columns").

Every writer builds its frame from these constants (`empty(SCHEMA)` / `frame(rows, SCHEMA)`),
so shards of one table always have identical dtypes and `pl.scan_parquet` over many run
directories never fails on a mismatched column. More columns than the contract lists are fine;
fewer are not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

Schema = dict[str, pl.DataType]

_STR = pl.String()
_I32 = pl.Int32()
_I64 = pl.Int64()
_F64 = pl.Float64()
_BOOL = pl.Boolean()
_TIME = pl.Datetime("us")
_STRLIST = pl.List(pl.String())
_F32LIST = pl.List(pl.Float32())

TURNS: Schema = {
    "conv_id": _STR,
    "session_index": _I32,  # 1-based session number (LoCoMo `session_<n>`, LongMemEval list position + 1)
    "session_id": _STR,  # LoCoMo "S<n>"; LongMemEval haystack session id
    "session_hash": _STR,  # hash of the session's turns and date: equal sessions share it
    "session_time": _TIME,
    "turn_index": _I32,  # 0-based position inside the session
    "dia_id": _STR,  # LoCoMo "D<session>:<n>"; LongMemEval "<session_id>_<n>" (1-based, all turns)
    "event_id": _STR,  # "<conv_id>:<dia_id>", the event anchor of every entry
    "speaker": _STR,
    "text": _STR,
    "image_caption": _STR,  # null when the turn shares no image
    "has_answer": _BOOL,  # LongMemEval evidence flag; null for LoCoMo
}

# The compact layout of `turns` (structmem_gpu/core/turns_store.py; LongMemEval): each distinct
# session content's turns once, and one row per occurrence (conversation, position, date).
# Readers use RunDir.read_table("turns"), which expands them to TURNS.
_OCCURRENCE = ("conv_id", "session_index", "event_id", "session_hash", "session_time")
TURN_SESSIONS: Schema = {
    "session_key": _STR,  # hash of session_id, the turns (speaker, text, caption), dia_ids, has_answer
    **{c: t for c, t in TURNS.items() if c not in _OCCURRENCE},
}

TURN_HAYSTACKS: Schema = {
    "conv_id": _STR,
    "session_index": _I32,  # 1-based position of the session in the conversation's haystack
    "session_key": _STR,  # -> TURN_SESSIONS
    "session_hash": _STR,  # this occurrence's (turns + date) hash: LongMemEval draws dates per haystack
    "session_time": _TIME,
}

# One row per conversation: the two speakers as the benchmark names them (LoCoMo's
# `speaker_a` / `speaker_b`, null when a record names none; LongMemEval: its roles, user then
# assistant). Who is speaker_a is not who speaks first (LoCoMo conv-30: Gina before Jon).
CONVERSATIONS: Schema = {
    "conv_id": _STR,
    "speaker_a": _STR,
    "speaker_b": _STR,
}

QUESTIONS: Schema = {
    "conv_id": _STR,
    "question_id": _STR,  # LoCoMo "<sample_id>:q<index>"; LongMemEval question_id
    "question": _STR,
    "answer": _STR,  # gold, always a string (LoCoMo ints are str()'d)
    "adversarial_answer": _STR,
    "category": _I32,
    "category_name": _STR,
    "evidence": _STRLIST,  # normalised dia_ids that resolve to turns
    "evidence_raw": _STRLIST,  # the file's list, unchanged
    "question_time": _TIME,  # null for LoCoMo
    "is_abstention": _BOOL,
}

ENTRIES: Schema = {
    "entry_id": _STR,
    "conv_id": _STR,
    "event_id": _STR,
    "dia_id": _STR,
    "session_index": _I32,
    "turn_index": _I32,
    "event_time": _TIME,
    "speaker": _STR,
    "kind": _STR,  # "fact" | "relation"
    "text": _STR,
    "request_id": _STR,
    "prompt_version": _STR,
    "model": _STR,
}

EMBEDDINGS: Schema = {
    "item_id": _STR,  # entry_id / synth_id / question_id / turn event_id
    "conv_id": _STR,
    "model": _STR,
    "text_hash": _STR,
    "embedding": _F32LIST,  # unit-norm float32; fixed length per model
}

SYNTHESES: Schema = {
    "synth_id": _STR,
    "conv_id": _STR,
    "window_index": _I32,
    "window_start": _TIME,
    "window_end": _TIME,
    "text": _STR,
    "buffer_entry_ids": _STRLIST,
    "seed_entry_ids": _STRLIST,
    "context_entry_ids": _STRLIST,
    "request_id": _STR,
    "prompt_version": _STR,
    "parse_ok": _BOOL,
}

REQUESTS: Schema = {
    "request_id": _STR,
    "stage": _STR,
    "conv_id": _STR,  # null when a request serves several conversations
    "model": _STR,
    "prompt_version": _STR,
    "prompt_tokens": _I64,
    "completion_tokens": _I64,
    "cached_tokens": _I64,  # prefix-cache hits where the server reports them, else null
    "latency_s": _F64,
    "finish_reason": _STR,
    "parse_ok": _BOOL,
    "salvaged": _BOOL,  # cut by max_tokens; only its complete list items were kept
    "cache_hit": _BOOL,
    "attempts": _I32,
    "messages_hash": _STR,
    "reply": _STR,
    "error": _STR,
    # No reply at all (transport failure, server gone, not sent while stopping): the stage that
    # sent it is incomplete until a rerun re-sends it. Null in runs written before this column.
    "unanswered": _BOOL,
}

RETRIEVALS: Schema = {
    "question_id": _STR,
    "conv_id": _STR,
    "circuit": _STR,  # "entries" | "syntheses" | "turns" | ... one row per (question, circuit, rank)
    "rank": _I32,
    "item_id": _STR,
    "score": _F64,
}

ANSWERS: Schema = {
    "question_id": _STR,
    "conv_id": _STR,
    "prediction": _STR,
    "request_id": _STR,
    "parse_ok": _BOOL,
}

JUDGMENTS: Schema = {
    "question_id": _STR,
    "judge_model": _STR,
    "judge_name": _STR,
    "prompt_version": _STR,
    "label": _BOOL,  # null = unjudged (the reply did not parse); never counted as wrong
    "reply_raw": _STR,
    "f1_locomo": _F64,
    "f1_mem0": _F64,
    "bleu1": _F64,
    "evidence_recall": _F64,  # null when the question has no resolvable evidence
}

# Offline update (methods/structmem/update.py): one row per candidate entry, keyed by the
# entry's ORIGINAL id (entry ids hash their text; an update never renames an entry).
ENTRY_UPDATES: Schema = {
    "entry_id": _STR,
    "conv_id": _STR,
    "old_text": _STR,
    "new_text": _STR,  # the rewritten text (decision "update" with a text); null otherwise
    "decision": _STR,  # "update" | "delete" | "ignore" (a reply that never parsed: "ignore")
    "source_entry_ids": _STRLIST,  # the later entries whose queue held it at >= the threshold
    "max_score": _F64,  # its highest score in those queues
    "request_id": _STR,
    "prompt_version": _STR,
    "parse_ok": _BOOL,
}

# Stage compress (LLMLingua-2, the reference's pre-compression): one row per turn.
COMPRESSED_TURNS: Schema = {
    "conv_id": _STR,
    "event_id": _STR,
    "session_index": _I32,
    "turn_index": _I32,
    "text": _STR,  # the reference's message: text + " (image description: <caption>)" for images
    "compressed": _STR,  # what the reference's message holds after compression
    "text_tokens": _I64,  # o200k_base (the extraction model's encoding, gpt-4o-mini)
    "compressed_tokens": _I64,
    "text_model_tokens": _I64,  # the compression model's tokenizer, special tokens included
    "compressed_model_tokens": _I64,
    "passes": _I32,  # successful compress_prompt calls (>1 = re-compressed while >= 512 tokens)
    "error": _STR,  # first compression error (the text then stays as it was); null = none
}

# Stage segment (topic segmentation + extraction batches): one row per topic segment.
SEGMENTS: Schema = {
    "conv_id": _STR,
    "segment_index": _I32,  # order of release within the conversation (= the topic number)
    "event_ids": _STRLIST,  # its turns, in order
    "reason": _STR,  # why it ended (segmenting.py: agreed, cosine_only, ..., lost_at_last_turn)
    "released_at": _STR,  # event id of the turn whose add_memory call released it
    "model_tokens": _I64,  # sensory-buffer tokens of its texts (compression model's tokenizer)
    "tokens": _I64,  # o200k tokens of its texts joined by spaces (what the batch budget counts)
    "batch_index": _I32,  # its extraction batch within the conversation; null = lost
    "batch_tokens": _I64,  # o200k tokens of the whole batch
    "batch_sessions": _I32,  # sessions the batch spans
    # event id of the turn whose add_memory call sent the batch (batches one call sends share
    # their numbering: methods/structmem/extraction_windows.segment_windows); null = lost
    "batch_released_at": _STR,
}

# A baseline system's memory (structmem_gpu/systems/stages.py), as the system reports it.
MEMORIES: Schema = {
    "conv_id": _STR,
    "memory_id": _STR,  # the system's own id (uuids seeded per conversation: rerun-stable)
    "owner": _STR,  # whose memory (mem0: the speaker's user id's speaker), null when shared
    "text": _STR,
    "created_at": _STR,  # the timestamp the system stores (LoCoMo: the session date text)
    "metadata": _STR,  # the rest, JSON
}

# One row per (conversation, phase) a baseline system worked on: what it kept and lost.
SYSTEM_UNITS: Schema = {
    "conv_id": _STR,
    "phase": _STR,  # build | search
    "status": _STR,  # ok | error | resumed (a finished unit of an earlier attempt)
    "memories": _I64,  # build: memories the system holds afterwards; search: hits returned
    "dropped": _I64,  # memories the system swallowed (unparseable or empty model reply)
    "drops": _STR,  # JSON list of {"where", "why"}
    "requests": _I64,  # calls the front recorded for the unit in this attempt
    "error": _STR,
    "log_tail": _STR,
    "wall_s": _F64,
}

TABLES: dict[str, Schema] = {
    "compressed_turns": COMPRESSED_TURNS,
    "segments": SEGMENTS,
    "turns": TURNS,
    "turn_sessions": TURN_SESSIONS,
    "turn_haystacks": TURN_HAYSTACKS,
    "conversations": CONVERSATIONS,
    "questions": QUESTIONS,
    "entries": ENTRIES,
    "entry_embeddings": EMBEDDINGS,
    "syntheses": SYNTHESES,
    "synthesis_embeddings": EMBEDDINGS,
    "entry_updates": ENTRY_UPDATES,
    "requests": REQUESTS,
    "retrievals": RETRIEVALS,
    "memories": MEMORIES,
    "system_units": SYSTEM_UNITS,
    "answers": ANSWERS,
    "judgments": JUDGMENTS,
}


def empty(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


def rows_frame(rows: Sequence[Any], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Dataclass rows (fields = the schema's columns; tuples become lists) to a frame with
    exactly the schema's dtypes, built column by column: from a dict per row (what `frame`
    takes), 35 k LongMemEval entries took 0.21-0.26 s of CPU; by columns, 0.07-0.08 s."""
    if not rows:
        return empty(schema)
    names = {f.name for f in dataclasses.fields(rows[0])}
    if names != set(schema):
        raise ValueError(f"{type(rows[0]).__name__} fields {sorted(names)} are not the "
                         f"table's columns {sorted(schema)}")
    return pl.DataFrame({c: [getattr(r, c) for r in rows] for c in schema}, schema=dict(schema))


def frame(rows: Iterable[Mapping[str, Any]], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Rows (dicts) to a frame with exactly the schema's dtypes; extra keys are an error."""
    rows = list(rows)
    if not rows:
        return empty(schema)
    return pl.DataFrame(rows, schema=dict(schema))


def conform(df: pl.DataFrame, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Cast and order the contract columns first; keep any extra columns after them."""
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise ValueError(f"table is missing contract columns {missing}")
    head = [pl.col(c).cast(t) for c, t in schema.items()]
    extra = [c for c in df.columns if c not in schema]
    return df.select(head + extra)
