"""Bring your own reference prompts (`prompts.sources.lightmem=PATH[@COMMIT]`, older name
`prompts.reference_dir`: a zjunlp/LightMem checkout, work tree or git repository).

The reference prompt texts are NOT part of this repository. With the LightMem source set,
the extract and consolidate stages read them at run time from the user's checkout
(docs/methods.md "StructMem: reference code": `src/lightmem/memory/prompts.py`, variables
`LoCoMo_Event_Binding_factual`, `LoCoMo_Event_Binding_relational`,
`LoCoMo_Cross_Event_Consolidation`). The file is parsed with `ast` (its string constants are
read, nothing of it is executed).

The extraction user message then has the reference's line format (§3.2): one topic marker,
then `[<ISO time with ms>, <weekday>] <source_id>.<speaker>: <text>` with source ids counting
from 0 in the window and the time stepping one second per turn; the reply is the reference's
`{"data": [{"source_id": 0, "fact": "..."}]}` (or `"relation"`), schema-constrained to the
window's source ids and mapped back to our turns (source_id + 1). The synthesis template's
placeholders `{bucket}`, `{speakers}`, `{aggregated_text}`, `{supplementary_context}` are
filled with our windows, records `[<time>, <weekday>] <speaker>: <text>`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.llm.types import Message
from structmem_gpu.prompts import list_reply_schema
from structmem_gpu.prompts.official import (
    BUILD_NAMES,
    LIGHTMEM_BUILD_FILE,
    build_texts,
    lightmem_build,
    source_spec,
)

if TYPE_CHECKING:
    from structmem_gpu.methods.structmem.prompts.synthesis import Record

class ReferenceTurn(Protocol):
    """What the reference's line format shows of a turn (extract.TurnView provides it)."""

    @property
    def session_time(self) -> datetime: ...

    @property
    def speaker(self) -> str: ...

    @property
    def text(self) -> str: ...


PROMPTS_FILE = LIGHTMEM_BUILD_FILE
NAMES = BUILD_NAMES
SYNTHESIS_FIELDS = ("bucket", "speakers", "aggregated_text", "supplementary_context")
NO_CONTEXT = "No additional context available."
SYNTHESIS_ROLE = "You are a conversation summarisation assistant who pays attention to time."


def reference_prompt(reference_dir: str, use: str) -> str:
    """The reference prompt for "fact" | "relation" | "synthesis" from the LightMem source
    `reference_dir` (`PATH` or `PATH@COMMIT`, prompts/sources.py); a clear error when absent."""
    name = NAMES.get(use)
    if name is None:
        raise ConfigError(f"no reference prompt for {use!r}; expected one of {sorted(NAMES)}")
    text = lightmem_build(reference_dir, name, f"the {use} prompt").text
    if use == "synthesis":
        missing = [f for f in SYNTHESIS_FIELDS if "{" + f + "}" not in text]
        if missing:
            raise ConfigError(
                f"prompts.sources.lightmem: {name} in {PROMPTS_FILE} lacks placeholders {missing}"
            )
    return text


def version(reference_dir: str, use: str) -> str:
    """'reference-fact/<hash of the text>': a changed checkout is a new prompt version."""
    return f"reference-{use}/{stable_hash(reference_prompt(reference_dir, use), length=10)}"


_IMAGE = re.compile(r"\[image: (.*)\]$", re.DOTALL)


def reference_text(text: str) -> str:
    """A turn as the reference driver shows it: the image caption appended as
    "(image description: ...)" instead of our "[image: ...]"."""
    return _IMAGE.sub(lambda m: f"(image description: {m.group(1)})", text)


def render_reference_window(turns: Sequence[ReferenceTurn]) -> str:
    """The reference's extraction input: a topic marker, then one line per turn."""
    lines = ["--- Topic 1 ---"]
    for i, t in enumerate(turns):
        when = t.session_time + timedelta(seconds=i)
        stamp = f"{when.isoformat(timespec='milliseconds')}, {when:%a}"
        lines.append(f"[{stamp}] {i}.{t.speaker}: {reference_text(t.text)}")
    return "\n".join(lines)


def render_reference_batch(turns: Sequence[ReferenceTurn], topics: Sequence[tuple[int, int]]) -> str:
    """An extraction batch of topic segments (extract.input=segments) as the reference
    renders it: "--- Topic N ---" before each segment's lines; source ids count the batch's
    turns from 0; within the batch, the turns of one session step one second each from its
    session time (assign_sequence_numbers_with_timestamps: 500 ms per message, the empty
    assistant placeholders included)."""
    lines, seen, i = [], Counter[datetime](), 0
    for topic, n in topics:
        lines.append(f"--- Topic {topic} ---")
        for t in turns[i : i + n]:
            when = t.session_time + timedelta(seconds=seen[t.session_time])
            seen[t.session_time] += 1
            stamp = f"{when.isoformat(timespec='milliseconds')}, {when:%a}"
            lines.append(f"[{stamp}] {i}.{t.speaker}: {reference_text(t.text)}")
            i += 1
    return "\n".join(lines)


def reply_schema(n_turns: int, kind: str, max_items: int | None) -> dict[str, Any]:
    """`{"data": [{"source_id": 0..n-1, kind: str}]}`."""
    item = {
        "type": "object",
        "properties": {
            "source_id": {"type": "integer", "enum": list(range(n_turns))},
            kind: {"type": "string", "minLength": 1},
        },
        "required": ["source_id", kind],
        "additionalProperties": False,
    }
    return list_reply_schema("data", item, max_items)


def _record_line(r: Record) -> str:
    return f"[{r.time.isoformat(timespec='milliseconds')}, {r.time:%a}] {r.speaker}: {r.text}"


def reference_synthesis_messages(
    reference_dir: str, buffer: Sequence[Record], context: Sequence[Record]
) -> tuple[Message, ...]:
    if not buffer:
        raise ValueError("a synthesis needs at least one buffer entry")
    template = reference_prompt(reference_dir, "synthesis")
    start, end = buffer[0].time, buffer[-1].time
    try:
        user = template.format(
            bucket=f"{start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S}",
            speakers=", ".join(sorted({r.speaker for r in buffer})),
            aggregated_text="\n".join(_record_line(r) for r in buffer),
            supplementary_context="\n".join(_record_line(r) for r in context) or NO_CONTEXT,
        )
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"prompts.sources.lightmem: {NAMES['synthesis']} in {PROMPTS_FILE} is not a format "
            f"template with only {list(SYNTHESIS_FIELDS)} ({e!r})"
        ) from e
    return (Message("system", SYNTHESIS_ROLE), Message("user", user))


def reference_fingerprint(job: Any) -> str | None:
    """Stage fingerprint material: the LightMem source's commit and build prompt texts
    (None without prompts.sources.lightmem / prompts.reference_dir)."""
    spec = source_spec(job, "lightmem")
    if spec is None:
        return None
    texts = build_texts(spec)
    return stable_hash(*(t.text for t in texts.values()), next(iter(texts.values())).commit)

