"""Bring your own reference prompts (`prompts.sources.lightmem=PATH[@COMMIT]`, older name
`prompts.reference_dir`: a zjunlp/LightMem checkout, work tree or git repository).

The reference prompt texts are NOT part of this repository. With the LightMem source set,
the extract and consolidate stages read them at run time from the user's checkout, each from
the file LightMem's LoCoMo build reads it from (prompts/official.py LIGHTMEM_FILES):
`experiments/locomo/prompts.py` for the extraction prompts add_locomo.py imports
(`LoCoMo_Event_Binding_factual`, `LoCoMo_Event_Binding_relational`; with
`extract.reference_mode=flat`, its flat mode, `METADATA_GENERATE_PROMPT_locomo`),
`src/lightmem/memory/prompts.py` for `LoCoMo_Cross_Event_Consolidation` (imported by
`utils.call_summary_llm`), and from `src/lightmem/memory/utils.py` `call_summary_llm` itself
the consolidation request's literal system message and its "no related entries" text. The
files are parsed with `ast` (their string constants are read, nothing of them is executed).

The extraction user message then has the reference's line format (§3.2): one topic marker,
then `[<ISO time with ms>, <weekday>] <source_id>.<speaker>: <text>` with source ids counting
from 0 in the window and the time stepping one second per turn; the reply is the reference's
`{"data": [{"source_id": 0, "fact": "..."}]}` (or `"relation"`), schema-constrained to the
window's source ids and mapped back to our turns (source_id + 1). The synthesis template's
placeholders are filled as LightMem's `summarize` fills them: `{bucket}` = "<first time> -
<last time>" of the window's entries (ISO with ms), `{speakers}` = their sorted speakers,
`{aggregated_text}` / `{supplementary_context}` = records `[<time>, <weekday>] <speaker>:
<text>` (utils.format_entries_for_prompt; entry kinds are never stored there, so no tag).
An entry's time is its session's (docs/methods.md "StructMem: reference code": the reference
stamps each entry with its source message's time, a second apart per turn).
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
    EXTRACTION_NAMES,
    LIGHTMEM_FILES,
    SYNTHESIS_NAME,
    OfficialText,
    lightmem_build,
    lightmem_summary_call,
)
from structmem_gpu.prompts.official import fingerprint as official_fingerprint

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


NAMES = BUILD_NAMES
MODES = tuple(EXTRACTION_NAMES)  # extract.reference_mode: add_locomo.py's --extraction_mode
SYNTHESIS_FIELDS = ("bucket", "speakers", "aggregated_text", "supplementary_context")


def prompt_name(use: str, mode: str = "event") -> str:
    """The LightMem variable for "fact" | "relation" (per extraction mode) | "synthesis"."""
    if use == "synthesis":
        return SYNTHESIS_NAME
    names = EXTRACTION_NAMES.get(mode)
    if names is None:
        raise ConfigError(f"extract.reference_mode={mode!r}: expected one of {list(MODES)}")
    if use not in names:
        raise ConfigError(f"no reference prompt for {use!r} in LightMem's {mode} extraction mode; "
                          f"expected one of {sorted(names)}")
    return names[use]


def prompt_file(use: str, mode: str = "event") -> str:
    """The checkout file that use's prompt is read from."""
    return LIGHTMEM_FILES[prompt_name(use, mode)]


def official_text(reference_dir: str, use: str, mode: str = "event") -> OfficialText:
    name = prompt_name(use, mode)
    t = lightmem_build(reference_dir, name, f"the {use} prompt")
    if use == "synthesis":
        missing = [f for f in SYNTHESIS_FIELDS if "{" + f + "}" not in t.text]
        if missing:
            raise ConfigError(
                f"prompts.sources.lightmem: {name} in {t.file} lacks placeholders {missing}"
            )
    return t


def reference_prompt(reference_dir: str, use: str, mode: str = "event") -> str:
    """The reference prompt for "fact" | "relation" | "synthesis" from the LightMem source
    `reference_dir` (`PATH` or `PATH@COMMIT`, prompts/sources.py), for extraction mode `mode`
    (event | flat); a clear error when absent."""
    return official_text(reference_dir, use, mode).text


def used_texts(reference_dir: str, uses: Sequence[str], mode: str = "event") -> dict[str, OfficialText]:
    """The official texts requests of `uses` send: the synthesis adds call_summary_llm's
    system message and its no-context text."""
    out = {u: official_text(reference_dir, u, mode) for u in uses}
    if "synthesis" in uses:
        out.update({f"synthesis[{k}]": v for k, v in lightmem_summary_call(reference_dir).items()})
    return out


def version(reference_dir: str, use: str, mode: str = "event") -> str:
    """'reference-fact/<hash of the texts sent>': a changed checkout text is a new prompt
    version (the synthesis': its template, system message and no-context text)."""
    texts = used_texts(reference_dir, [use], mode)
    material = [t.text for _, t in sorted(texts.items())]
    return f"reference-{use}/{stable_hash(*material, length=10)}"


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


def render_reference_batch(turns: Sequence[ReferenceTurn], topics: Sequence[tuple[int, int]],
                           number_from: int = 0,
                           seconds_from: Sequence[tuple[datetime, int]] = ()) -> str:
    """An extraction batch of topic segments (extract.input=segments) as the reference
    renders it: "--- Topic N ---" before each segment's lines; source ids count the turns of
    the add_memory call's batches from 0 (`number_from`: the turns of the same call's earlier
    batches); the turns of one session step one second each from its session time, counted
    over the call's batches too (`seconds_from`) — assign_sequence_numbers_with_timestamps runs
    over the call's whole extract_list (500 ms per message, the empty assistant placeholders
    included)."""
    lines, seen, i = [], Counter[datetime](dict(seconds_from)), 0
    for topic, n in topics:
        lines.append(f"--- Topic {topic} ---")
        for t in turns[i : i + n]:
            when = t.session_time + timedelta(seconds=seen[t.session_time])
            seen[t.session_time] += 1
            stamp = f"{when.isoformat(timespec='milliseconds')}, {when:%a}"
            lines.append(f"[{stamp}] {number_from + i}.{t.speaker}: {reference_text(t.text)}")
            i += 1
    return "\n".join(lines)


def reply_schema(n_turns: int, kind: str, max_items: int | None, first: int = 0) -> dict[str, Any]:
    """`{"data": [{"source_id": first..first+n-1, kind: str}]}`."""
    item = {
        "type": "object",
        "properties": {
            "source_id": {"type": "integer", "enum": list(range(first, first + n_turns))},
            kind: {"type": "string", "minLength": 1},
        },
        "required": ["source_id", kind],
        "additionalProperties": False,
    }
    return list_reply_schema("data", item, max_items)


def _record_line(r: Record) -> str:
    return f"[{r.time.isoformat(timespec='milliseconds')}, {r.time:%a}] {r.speaker}: {r.text}"


def _stamp(when: datetime) -> str:
    return when.isoformat(timespec="milliseconds")


def _record_line(r: Record) -> str:
    return f"[{_stamp(r.time)}, {r.time:%a}] {r.speaker}: {r.text}"


def reference_synthesis_messages(
    reference_dir: str, buffer: Sequence[Record], context: Sequence[Record],
    texts: dict[str, OfficialText] | None = None,
) -> tuple[Message, ...]:
    """LightMem's summarize + call_summary_llm: its literal system message, the template
    filled with the window's time range ("<first> - <last>", the entries' ISO times with ms),
    sorted speakers and records; the no-context text when no related entry was found.
    `texts`: used_texts(reference_dir, ["synthesis"]), read once by a caller with many windows."""
    if not buffer:
        raise ValueError("a synthesis needs at least one buffer entry")
    texts = texts if texts is not None else used_texts(reference_dir, ["synthesis"])
    start, end = buffer[0].time, buffer[-1].time
    try:
        user = texts["synthesis"].text.format(
            bucket=f"{_stamp(start)} - {_stamp(end)}",
            speakers=", ".join(sorted({r.speaker for r in buffer})),
            aggregated_text="\n".join(_record_line(r) for r in buffer),
            supplementary_context=("\n".join(_record_line(r) for r in context)
                                   or texts["synthesis[no_context]"].text),
        )
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"prompts.sources.lightmem: {NAMES['synthesis']} in {LIGHTMEM_FILES[SYNTHESIS_NAME]} "
            f"is not a format template with only {list(SYNTHESIS_FIELDS)} ({e!r})"
        ) from e
    return (Message("system", texts["synthesis[system]"].text), Message("user", user))


def texts_fingerprint(reference_dir: str | None, uses: Sequence[str], mode: str = "event") -> str | None:
    """Stage fingerprint material: the commit and hash of every official text the stage's
    requests send (None without prompts.sources.lightmem / prompts.reference_dir)."""
    if reference_dir is None:
        return None
    return official_fingerprint(used_texts(reference_dir, uses, mode))
