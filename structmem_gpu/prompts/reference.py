"""Bring your own reference prompts (`prompts.reference_dir=PATH`, a zjunlp/LightMem checkout).

The reference prompt texts are NOT part of this repository. With `prompts.reference_dir` set,
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

import ast
import functools
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from structmem_gpu.errors import ConfigError
from structmem_gpu.hashing import stable_hash
from structmem_gpu.llm.types import Message
from structmem_gpu.prompts import list_reply_schema



class ReferenceTurn(Protocol):
    """What the reference's line format shows of a turn (extract.TurnView provides it)."""

    @property
    def session_time(self) -> datetime: ...

    @property
    def speaker(self) -> str: ...

    @property
    def text(self) -> str: ...
    from structmem_gpu.prompts.synthesis import Record

PROMPTS_FILE = "src/lightmem/memory/prompts.py"
NAMES = {
    "fact": "LoCoMo_Event_Binding_factual",
    "relation": "LoCoMo_Event_Binding_relational",
    "synthesis": "LoCoMo_Cross_Event_Consolidation",
}
SYNTHESIS_FIELDS = ("bucket", "speakers", "aggregated_text", "supplementary_context")
NO_CONTEXT = "No additional context available."
SYNTHESIS_ROLE = "You are a conversation summarisation assistant who pays attention to time."


@functools.cache
def load_prompts(reference_dir: str) -> dict[str, str]:
    """Every top-level string constant of the checkout's prompts file, by variable name."""
    path = Path(reference_dir).expanduser() / PROMPTS_FILE
    if not path.is_file():
        raise ConfigError(
            f"prompts.reference_dir={reference_dir!r}: {path} not found (expected a LightMem "
            "checkout containing src/lightmem/memory/prompts.py)"
        )
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ConfigError(f"prompts.reference_dir: {path} does not parse: {e}") from e
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = node.value.value
    return out


def reference_prompt(reference_dir: str, use: str) -> str:
    """The reference prompt for "fact" | "relation" | "synthesis"; a clear error when absent."""
    name = NAMES.get(use)
    if name is None:
        raise ConfigError(f"no reference prompt for {use!r}; expected one of {sorted(NAMES)}")
    prompts = load_prompts(reference_dir)
    if name not in prompts:
        raise ConfigError(
            f"prompts.reference_dir={reference_dir!r}: {PROMPTS_FILE} defines no string "
            f"{name!r} (the {use} prompt)"
        )
    text = prompts[name]
    if use == "synthesis":
        missing = [f for f in SYNTHESIS_FIELDS if "{" + f + "}" not in text]
        if missing:
            raise ConfigError(
                f"prompts.reference_dir: {name} in {PROMPTS_FILE} lacks placeholders {missing}"
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
            f"prompts.reference_dir: {NAMES['synthesis']} in {PROMPTS_FILE} is not a format "
            f"template with only {list(SYNTHESIS_FIELDS)} ({e!r})"
        ) from e
    return (Message("system", SYNTHESIS_ROLE), Message("user", user))


def reference_fingerprint(cfg: Any) -> str | None:
    """Stage fingerprint material: the checkout's prompt texts (None without reference_dir)."""
    from omegaconf import OmegaConf

    ref = OmegaConf.select(cfg, "prompts.reference_dir", default=None)
    if ref is None:
        return None
    return stable_hash(*(reference_prompt(str(ref), use) for use in NAMES))
