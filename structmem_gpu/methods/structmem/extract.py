"""Stage `extract`: dual-perspective extraction (paper §3.1;
docs/methods.md "StructMem: extraction").

    python jobs/run.py benchmark=sample method=structmem stages=[load,extract]

Windows of consecutive turns of one session (planned in extraction_windows.py), packed up to
`extract.window_tokens` tokens (structmem_gpu/methods/structmem/packing.py) and/or at most `extract.turns_per_request` turns
(plus `extract.context_turns` earlier turns of that session shown read-only), each yield one
request per perspective in `extract.perspectives`; every window of every conversation goes out in ONE
`ctx.generate` batch, each request built as the client draws it (a stream: llm/types.py). A
reply item's `turn` is the window-local number 1..n and maps back to that turn's event. One
entry row:

    EntryRow(entry_id="3f0c9a1be2d47c55", conv_id="sample-1", event_id="sample-1:D2:1",
             dia_id="D2:1", session_index=2, turn_index=0, event_time=datetime(2024, 3, 17, 19, 5),
             speaker="Tomas", kind="fact", text="Tomas adopted a beagle puppy named Biscuit.",
             request_id="extract:9b1d...", prompt_version="factual/2", model="smollm2|...")

ctx.notes: windows, window_tokenizer, window_plan (digest of the windows; the dry run prints
the same), split_turns (turns longer than the window budget, sent in parts), prompt_variant,
requests, parse_failures, truncated, salvaged (cut replies whose complete items were kept),
rejected_items (unknown turn number), empty_items, duplicate_items, entries, entries_fact / entries_relation, turns, turns_covered.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

import polars as pl

from structmem_gpu.core import schemas, turns_store
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling, request_id
from structmem_gpu.llm.tokens import (
    CHARS,
    CHARS_COUNTER,
    CHARS_PER_TOKEN,
    TextCounter,
    text_counter,
)
from structmem_gpu.methods.structmem.extraction_windows import (
    ExtractionWindow,
    TurnView,
    _turn_view,
    plan_windows,
    render_batch,
    segment_windows,
    window_plan_hash,
    with_compressed,
)
from structmem_gpu.methods.structmem.prompts import extraction_prompt
from structmem_gpu.prompts import extraction_schema, render_window
from structmem_gpu.methods.structmem.prompts.reference import texts_fingerprint
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.config.settings import (
    COUNT,
    External,
    Note,
    SIZE,
    Settings,
    TEMPERATURE,
    TOKENS,
    TOP_P,
    YamlExpr,
)
from structmem_gpu.stage import LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

STAGE_NAME = "extract"


@dataclass(frozen=True)
class EntryRow:
    entry_id: str
    conv_id: str
    event_id: str
    dia_id: str
    session_index: int
    turn_index: int
    event_time: datetime
    speaker: str
    kind: str
    text: str
    request_id: str
    prompt_version: str
    model: str


class ExtractSettings(Settings):
    """conf/method/structmem.yaml `extract:` (+ prompts.sources.lightmem); the block is
    generated from these fields (config/yaml_defaults.py)."""

    node: ClassVar[str] = "extract"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    window_tokens: Annotated[int, Field(ge=1), Note("null = fixed turn windows")] | None = Field(850, description=(
        'Token budget per request: consecutive turns of one session are packed up to this many '
        'tokens of "Speaker: text" (the model\'s tokenizer when it is on disk, else chars/4). 850 '
        'is reference-like (512 tokens of LLMLingua-2 text at rate 0.6); LoCoMo sessions average '
        '~740, so ~one request pair per session. null = windows of turns_per_request turns only. '
        'Smaller = more requests (the paper\'s Eq. 1 is per utterance), larger = fewer, longer '
        'replies.'))
    window_tokenizer: Annotated[str | None, YamlExpr("${llm_or:tokenizer,chars}")] = Field("chars", description=(
        "What counts window_tokens (and cuts a longer turn into parts, each keeping its turn id "
        "and speaker): chars = characters / 4, or an HF tokenizer id / local folder, which must "
        "be on this machine (never downloaded; a missing one stops the job and the dry run "
        "naming the fix, `python jobs/data.py models ...`), so every machine cuts the same "
        "windows. Default: the LLM profile's `llm.tokenizer` (vLLM presets: the model's own "
        "tokenizer, `${llm.model}`; llama.cpp: chars, a GGUF has no HF tokenizer; vllm_cpu: its "
        "converted folder). null = chars."))
    turns_per_request: Annotated[int, Field(ge=1)] | None = Field(64, description=(
        "Max turns per request (with window_tokens: a cap; alone: fixed-size windows; 1 = the "
        "paper's per-utterance Eq. 1). More amortises the instructions, at the risk of skipped "
        "turns. null = no cap (needs window_tokens)."))
    context_turns: COUNT = Field(2, description=(
        "Earlier turns of the same session shown read-only before the window (context, no "
        "entries), so a reply at a window's first turn keeps the turn it answers. 0 saves prompt "
        "tokens."))
    perspectives: tuple[Literal["fact", "relation"], ...] = Field(("fact", "relation"), description=(
        "Perspectives extracted per window: fact (factual prompt) and/or relation (relational "
        "prompt)."))
    prompt_variant: Literal["default", "grounded"] = Field("default", description=(
        "default = the reference prompts' instructions in our words (inferred insights as extra "
        "entries, relative times kept and anchored); grounded = our stricter wording (computed "
        "dates, no inference, relational causes/co-participation). Ignored with "
        "prompts.sources.lightmem."))
    worked_example: Annotated[bool, YamlExpr("${llm_or:budgets.worked_example,true}")] = Field(True, description=(
        "The default prompts' worked examples (the reference teaches by example). From the LLM "
        "profile: the CPU profile's 135M model copies an example's facts into its replies, so it "
        "leaves them out; every real model keeps them."))
    max_tokens: Annotated[TOKENS, YamlExpr("${llm_or:budgets.extract_max_tokens,4096}")] = Field(4096, description=(
        "Output budget per request, from the LLM profile (llm.budgets; GPU profiles 4096, the "
        "reference allows 16000; the CPU profile a 135M model's). A reply cut here keeps its "
        "complete items (counted as salvaged); more costs time only when the model uses it."))
    max_items: Annotated[Annotated[int, Field(ge=1)] | None, YamlExpr("${llm_or:budgets.extract_max_items,null}")] = Field(None, description=(
        "JSON-schema bound maxItems (null = unbounded, as the reference); tight bounds keep a "
        "small model's reply short, loose ones lose nothing on real models."))
    max_item_chars: Annotated[SIZE, YamlExpr("${llm_or:budgets.extract_max_item_chars,400}")] = Field(400, description=(
        "JSON-schema bound maxLength per item (characters); tight bounds keep a small model's "
        "reply short, loose ones lose nothing on real models."))
    temperature: TEMPERATURE = Field(0.1, description=(
        "Sampling as the reference extracts (temperature 0.1, top_p 0.1: nearly greedy, seeded "
        "by llm.seed). Every profile, the CPU one included, uses it: nothing asks a small model "
        "for other values. 0 / 1.0 = greedy decoding (other replies, other cache keys)."))
    top_p: TOP_P = Field(0.1, description=(
        "Nucleus mass of the same sampling (see temperature)."))
    input: Literal["turns", "compressed", "segments"] = Field("turns", description=(
        "What the windows hold: turns (raw turns, session windows); compressed (the compress "
        "stage's texts, session windows); segments (the segment stage's extraction batches of "
        "compressed text, which may span sessions: the reference). compressed/segments need "
        "those stages in method.stages."))
    once_per_content: bool = Field(False, description=(
        "LongMemEval (compact turns) only. false = one request per distinct (session, date): "
        "the prompt carries that occurrence's date, as the reference extracts every session it "
        "is given. true = one request per distinct session content, at its first occurrence's "
        "date; each occurrence's entries take that occurrence's session date (a deviation, "
        "docs/replication.md \"Replicating the papers\": dates the model wrote into an entry's text stay "
        "anchored to the first date)."))
    reference_mode: Literal["event", "flat"] = Field("event", description=(
        "With prompts.sources.lightmem only: add_locomo.py's --extraction_mode, i.e. which "
        "official prompt the fact perspective sends. event = LoCoMo_Event_Binding_factual (and "
        "the relational prompt: StructMem); flat = METADATA_GENERATE_PROMPT_locomo, LightMem's "
        "flat memory (the fact perspective only; experiment=flat_locomo_reference_code). "
        "Ignored with our own prompts."))
    # A LightMem checkout: its prompts (methods/structmem/prompts/reference.py).
    reference_dir: Annotated[str | None, External("prompts.sources.lightmem")] = None

    def check(self) -> list[str]:
        out = []
        if self.turns_per_request is None and self.window_tokens is None:  # no window unit at all
            out.append("extract.window_tokens=None: expected an integer >= 1 when "
                       "extract.turns_per_request is null (a window needs a size)")
        if not self.perspectives:
            out.append("extract.perspectives=[]: expected at least one of 'fact', 'relation'")
        if self.reference_mode == "flat" and self.reference_dir is not None \
                and tuple(self.perspectives) != ("fact",):
            out.append(f"extract.reference_mode=flat with extract.perspectives="
                       f"{list(self.perspectives)}: LightMem's flat mode has the factual prompt "
                       "only; expected perspectives=[fact]")
        return out


@dataclass
class MappedItems:
    entries: list[EntryRow] = field(default_factory=list)
    rejected: int = 0  # items whose turn number is not in 1..n
    empty: int = 0  # items with blank text


def entry_id(conv_id: str, event_id: str, kind: str, text: str) -> str:
    return stable_hash(conv_id, event_id, kind, text)


def window_counter(
    s: ExtractSettings, llm: LLMSettings | None = None, *, convert: bool = False
) -> TextCounter:
    """What counts the window budget: `extract.window_tokenizer` (ConfigError when it names a
    tokenizer that is not on this machine); chars when windows are fixed turn counts.

    The vllm_cpu profile's tokenizer is its converted model folder (`llm.convert_from_gguf`):
    with `convert` (the job, which converts it a moment later anyway to serve it) a missing
    folder is made first; the dry run writes nothing and names the command instead.

    `llm`: the job's LLMSettings (`job.root.llm`), or None."""
    if s.window_tokens is None:
        return CHARS_COUNTER
    own = llm is not None and llm.model is not None and str(llm.model) == s.window_tokenizer
    source = llm.convert_from_gguf if own and llm is not None else None
    if source and llm is not None and not llm.base_url:
        from pathlib import Path

        from structmem_gpu.llm.convert import ensure_hf_model, is_converted

        folder = Path(s.window_tokenizer).expanduser()
        if not is_converted(folder):
            if not convert:
                raise ConfigError(
                    f"extract.window_tokenizer={s.window_tokenizer!r}: the model folder is not "
                    "converted yet; make it with `python jobs/data.py smollm2-hf` (or run the "
                    "job, which converts it) or set extract.window_tokenizer=chars"
                )
            ensure_hf_model(folder, source, python=llm.server_python)
    return text_counter(
        s.window_tokenizer, llm.revision if own and llm is not None else None,
        key="extract.window_tokenizer",
    )


def plan_from_settings(
    turns: pl.DataFrame, s: ExtractSettings, llm: LLMSettings | None, *, convert: bool = False
) -> tuple[list[ExtractionWindow], str]:
    """The stage's windows for its settings, and the name of the token counter used (the dry
    run calls this too, so both cut the same windows). `llm`: see window_counter."""
    counter = window_counter(s, llm, convert=convert)
    windows = plan_windows(turns, s.turns_per_request, s.context_turns, s.window_tokens, counter)
    return windows, counter.name


# One schema object per window size, shared by every request of that size: the client, the
# validator and the cache key memoise per schema object (llm/types.schema_json), and a fresh
# dict per window defeated all three. Shared, so never mutated.
@functools.lru_cache(maxsize=1024)
def _shared_schema(n_turns: int, max_items: int | None, max_item_chars: int) -> dict[str, Any]:
    return extraction_schema(n_turns, max_items=max_items, max_item_chars=max_item_chars)


@functools.lru_cache(maxsize=1024)
def _shared_reference_schema(n_turns: int, kind: str, max_items: int | None,
                             first: int = 0) -> dict[str, Any]:
    from structmem_gpu.methods.structmem.prompts import reference as R

    return R.reply_schema(n_turns, kind, max_items, first)


def build_request(window: ExtractionWindow, kind: str, s: ExtractSettings) -> LLMRequest:
    if s.reference_dir is not None:
        return reference_request(window, kind, s)
    prompt = extraction_prompt(kind)
    user = render_batch(window.turns) if window.topics else render_window(
        window.session_time,
        [(t.speaker, t.text) for t in window.context],
        [(t.speaker, t.text) for t in window.turns],
    )
    schema = _shared_schema(len(window.turns), s.max_items, s.max_item_chars)
    version = prompt.version(s.prompt_variant, s.worked_example)
    # Content-derived id: stable across reruns (resume, caches); the first event keeps two
    # identical windows of one conversation apart.
    rid = request_id(
        STAGE_NAME, window.conv_id, window.turns[0].event_id, kind, version, user, schema
    )
    return LLMRequest(
        request_id=rid,
        stage=STAGE_NAME,
        conv_id=window.conv_id,
        messages=(
            Message("system", prompt.system(s.prompt_variant, s.worked_example)),
            Message("user", user),
        ),
        prompt_version=version,
        schema=schema,
        sampling=Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens),
    )


def reference_request(window: ExtractionWindow, kind: str, s: ExtractSettings) -> LLMRequest:
    """The request in the reference format (prompts.reference_dir: its prompt and line format)."""
    from structmem_gpu.methods.structmem.prompts import reference as R

    assert s.reference_dir is not None
    system = R.reference_prompt(s.reference_dir, kind, s.reference_mode)
    user = (R.render_reference_batch(window.turns, window.topics, window.number_from,
                                     window.seconds_from) if window.topics
            else R.render_reference_window(window.turns))
    schema = _shared_reference_schema(len(window.turns), kind, s.max_items, window.number_from)
    ver = R.version(s.reference_dir, kind, s.reference_mode)
    rid = request_id("extract", window.conv_id, window.turns[0].event_id, kind, ver, user, schema)
    return LLMRequest(
        request_id=rid,
        stage="extract",
        conv_id=window.conv_id,
        messages=(Message("system", system), Message("user", user)),
        prompt_version=ver,
        schema=schema,
        sampling=Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens),
    )


def planned(
    windows: Sequence[ExtractionWindow], s: ExtractSettings,
    plan: list[tuple[ExtractionWindow, str, LLMRequest]], *, shared: bool = False,
) -> Iterator[LLMRequest]:
    """Each window's request per perspective, built as the client draws it (so the server
    starts on the first ones while the rest are built: llm/types.py) and kept in `plan` with
    its window. Grouped by perspective: consecutive requests share the system prompt, which
    llama.cpp (one slot, reuses the previous prompt's common prefix) then evaluates once per
    group. `shared`: one request serves every conversation holding the session (conv_id null)."""
    for kind in s.perspectives:
        for w in windows:
            req = build_request(w, kind, s)
            if shared:
                req = dataclasses.replace(req, conv_id=None)
            plan.append((w, kind, req))
            yield req


def map_items(
    window: ExtractionWindow, kind: str, request: LLMRequest, result: LLMResult
) -> MappedItems:
    """Reply items -> entries bound to the window's turns; unknown turn numbers are rejected."""
    out = MappedItems()
    if not result.parse_ok or not isinstance(result.data, dict):
        return out
    for item in reply_items(result.data, kind, window.number_from):
        turn, text = item.get("turn"), str(item.get("text") or "").strip()
        if (
            isinstance(turn, bool)
            or not isinstance(turn, int)
            or not 1 <= turn <= len(window.turns)
        ):
            out.rejected += 1
            continue
        if not text:
            out.empty += 1
            continue
        t = window.turns[turn - 1]
        out.entries.append(
            EntryRow(
                entry_id(window.conv_id, t.event_id, kind, text),
                window.conv_id,
                t.event_id,
                t.dia_id,
                t.session_index,
                t.turn_index,
                t.session_time,
                t.speaker,
                kind,
                text,
                request.request_id,
                request.prompt_version,
                result.model,
            )
        )
    return out


def reply_items(data: dict[str, Any], kind: str, first: int = 0) -> list[dict[str, Any]]:
    """Our reply `{"entries": [{"turn", "text"}]}`, or the reference format `{"data":
    [{"source_id", "fact" | "relation"}]}` (prompts.reference_dir; source ids count from
    `first` in the window: ExtractionWindow.number_from) as the same {"turn": 1-based, "text"}
    items."""
    if "entries" in data:
        return [i for i in data.get("entries") or [] if isinstance(i, dict)]
    out = []
    for item in data.get("data") or []:
        if not isinstance(item, dict):
            continue
        sid = item.get("source_id")
        turn = sid - first + 1 if isinstance(sid, int) and not isinstance(sid, bool) else None
        out.append({"turn": turn, "text": item.get(kind, item.get("fact", item.get("relation")))})
    return out


def entries_frame(rows: Sequence[EntryRow]) -> pl.DataFrame:
    return schemas.rows_frame(rows, schemas.ENTRIES)


def collect_entries(
    plan: Sequence[tuple[ExtractionWindow, str, LLMRequest]],
    results: Sequence[LLMResult],
    notes: dict[str, Any],
) -> list[EntryRow]:
    """Map every reply, dedupe identical entry ids (first wins) and count what was dropped."""
    seen: dict[str, EntryRow] = {}
    counts = {
        "parse_failures": 0,
        "truncated": 0,
        "salvaged": 0,
        "rejected_items": 0,
        "empty_items": 0,
        "duplicate_items": 0,
    }
    for (window, kind, req), res in zip(plan, results, strict=True):
        counts["parse_failures"] += not res.parse_ok
        counts["truncated"] += res.finish_reason == "length"
        counts["salvaged"] += res.salvaged
        mapped = map_items(window, kind, req, res)
        counts["rejected_items"] += mapped.rejected
        counts["empty_items"] += mapped.empty
        for row in mapped.entries:
            if row.entry_id in seen:
                counts["duplicate_items"] += 1
            else:
                seen[row.entry_id] = row
    notes.update(counts)
    if counts["rejected_items"] or counts["parse_failures"]:
        log.warning(
            "extract: %d parse failures, %d items with unknown turn numbers rejected (see requests.parquet)",
            counts["parse_failures"],
            counts["rejected_items"],
        )
    return list(seen.values())


# ---- once per distinct session (the compact turns layout: LongMemEval) -------------------
# Windows never cross a session and their read-only context comes from the same session
# (plan_windows), so a window's prompt depends on the session (turns and date) alone: the same
# session at the same date in 12 haystacks gives 12 identical prompts. With the compact layout
# (turns_store.py) the windows are planned over its distinct (content, date) pairs
# (`CompactTurns.dated_sessions`), sent once, and each reply's entries are bound to every
# conversation that lists the session at that date, in the order the
# per-conversation plan produces them (perspective, conversation, session, window), with the
# same entry ids (hash of conv_id, event_id, kind, text). The entries table is the plain
# layout's except `request_id`, which names the one shared request (its conv_id is null:
# shared); requests.parquet has one row per distinct window and perspective; the notes count
# distinct windows (`windows`, `requests`) and the occurrences they serve
# (`window_occurrences`). tests/unit/test_lme_layout_pipeline.py checks the equality.


def per_session_applies(ctx: StageContext) -> bool:
    """True when the run's turns are in the compact layout (and not also plain) and the
    windows are cut from the raw turns: compressed or segmented input (extract.input) is
    per conversation, so it takes the plain path over the expanded turns."""
    return (ctx.settings.input == "turns" and turns_store.has_compact(ctx.run)
            and not ctx.run.table_path("turns").exists())


def sessions_to_extract(compact: turns_store.CompactTurns, once_per_content: bool
                        ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(dated keys, one-session turns frame) of what the per-session path extracts: each
    distinct (content, date) as its own one-session "conversation" named by its dated_key (the
    prompt carries the session date, so a pool session at another date in another haystack is
    another request: LongMemEval draws dates per haystack); once_per_content: each content only
    at its first occurrence's date. The stage and its dry-run estimate both plan from this."""
    keys = compact.dated_keys()
    if once_per_content:
        keys = keys.unique("session_key", keep="first", maintain_order=True)
    return keys, compact.dated_sessions(keys)


def run_per_session(ctx: StageContext, s: ExtractSettings) -> tuple[list[EntryRow], dict[str, Any]]:
    compact = turns_store.read_compact(ctx.run)
    keys, pseudo = sessions_to_extract(compact, s.once_per_content)
    windows, counter = plan_from_settings(pseudo, s, ctx.job.root.llm, convert=True)
    plan: list[tuple[ExtractionWindow, str, LLMRequest]] = []
    results = ctx.generate(planned(windows, s, plan, shared=True), desc="extract",
                           total=len(windows) * len(s.perspectives))  # one batch
    notes: dict[str, Any] = {}
    # collect_entries maps and counts per request (parse failures, rejected items ...).
    per_session = collect_entries(plan, results, notes)
    by_key: dict[tuple[str, str], list[EntryRow]] = defaultdict(list)
    for row in per_session:  # in plan order: perspective, session, window, reply item
        by_key[(row.kind, row.conv_id)].append(row)
    on = ["session_key"] if s.once_per_content else ["session_key", *turns_store.DATED]
    hay = (compact.haystacks.join(keys.select(*on, "dated_key"), on=on, how="left")
           .select("conv_id", "session_index", "dated_key", "session_time")
           .sort("conv_id", "session_index"))
    rows: list[EntryRow] = []
    seen: set[str] = set()
    duplicates = 0
    for kind in s.perspectives:
        for conv, index, key, when in hay.iter_rows():
            for r in by_key.get((kind, key), ()):
                event = f"{conv}:{r.dia_id}"
                eid = entry_id(conv, event, kind, r.text)
                if eid in seen:
                    duplicates += 1
                    continue
                seen.add(eid)
                # the constructor, not dataclasses.replace (~3x its cost per row: 45 k rows)
                # An entry's time is its turn's, i.e. its session's: the occurrence's date
                # (equal to the request's own unless once_per_content shares it).
                rows.append(EntryRow(eid, conv, event, r.dia_id, index, r.turn_index,
                                     when if s.once_per_content else r.event_time, r.speaker,
                                     r.kind, r.text, r.request_id, r.prompt_version, r.model))
    occurrences = hay.group_by("dated_key").len()
    per_key_windows = defaultdict(int)
    for w in windows:
        per_key_windows[w.conv_id] += 1
    notes.update(
        layout=("compact: one request per distinct session content window (once_per_content)"
                if s.once_per_content else "compact: one request per distinct session window"),
        windows=len(windows),
        window_occurrences=sum(per_key_windows[k] * n for k, n in occurrences.iter_rows()),
        window_tokenizer=counter,
        window_plan=window_plan_hash(windows),
        split_turns=len({t.event_id for w in windows for t in w.turns if t.part}),
        requests=len(plan),
        duplicate_items=notes.get("duplicate_items", 0) + duplicates,
    )
    return rows, notes


def run_extract(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: ExtractSettings = ctx.settings
    if per_session_applies(ctx):  # compact turns (LongMemEval): once per distinct session
        rows, notes = run_per_session(ctx, s)
        ctx.notes.update(
            notes,
            prompt_variant="reference" if s.reference_dir else s.prompt_variant,
            entries=len(rows),
            turns=turns_store.read_compact(ctx.run).turn_count,
            turns_covered=len({r.event_id for r in rows}),
            **{f"entries_{k}": sum(r.kind == k for r in rows) for k in s.perspectives},
        )
        log.info("extract: %s", ctx.notes)
        return {"entries": entries_frame(rows)}
    turns = ctx.read("turns")
    if s.input != "turns":
        turns = with_compressed(turns, ctx.read("compressed_turns"))
    if s.input == "segments":
        windows, counter = segment_windows(turns, ctx.read("segments")), "segments (o200k)"
    else:
        windows, counter = plan_from_settings(turns, s, ctx.job.root.llm, convert=True)
    plan: list[tuple[ExtractionWindow, str, LLMRequest]] = []
    results = ctx.generate(planned(windows, s, plan), desc="extract",
                           total=len(windows) * len(s.perspectives))  # one batch, all conversations
    rows = collect_entries(plan, results, ctx.notes)
    covered = len({r.event_id for r in rows})
    ctx.notes.update(
        windows=len(windows),
        window_tokenizer=counter,
        window_plan=window_plan_hash(windows),
        split_turns=len({t.event_id for w in windows for t in w.turns if t.part}),
        prompt_variant="reference" if s.reference_dir else s.prompt_variant,
        input=s.input,
        cross_session_windows=sum(len({t.session_index for t in w.turns}) > 1 for w in windows),
        requests=len(plan),
        entries=len(rows),
        turns=turns.height,
        turns_covered=covered,
        **{f"entries_{k}": sum(r.kind == k for r in rows) for k in s.perspectives},
    )
    log.info("extract: %s", ctx.notes)
    return {"entries": entries_frame(rows)}


# ---- dry run (Stage.estimate) ------------------------------------------------------------


def approximate_batches(turns: pl.DataFrame, budget: int, count: Callable[[str], int]) -> list[ExtractionWindow]:
    """Extraction batches over `turns` (already stand-in compressed) for the dry run: every
    turn its own topic segment, packed per conversation to `budget` tokens by `count` (a turn
    that would exceed it starts the next batch), across sessions, as the reference's
    short-term buffer. The real cuts need the segmenter's model."""
    out: list[ExtractionWindow] = []
    ordered = turns.sort("conv_id", "session_index", "turn_index")
    for (conv_id,), frame in ordered.group_by("conv_id", maintain_order=True):
        views = [_turn_view(r) for r in frame.iter_rows(named=True)]
        batch: list[TurnView] = []
        used = 0
        for v in [*views, None]:
            need = 0 if v is None else count(v.text)
            if batch and (v is None or used + need > budget):
                topics = tuple((i, 1) for i in range(len(out), len(out) + len(batch)))
                out.append(ExtractionWindow(str(conv_id), batch[0].session_index, batch[0].session_time,
                                            tuple(batch), (), topics))
                batch, used = [], 0
            if v is not None:
                batch.append(v)
                used += need
    return out


# Share of the items a reply may hold (extract.max_items) that it does hold: SmolLM2-135M on
# the sample (debug=ci: max_items 3, windows of 7-8 turns, 2026-12-02) returned 37 entries
# in 18 replies that could hold 54. The stand-in entries keep that share of each window's
# turns, so the readers and consolidation see as many entries as a run writes (all of
# max_items per reply made structmem's reader prompts 8% and flat's 29% longer than sent).
REPLY_FILL = 37 / 54


def expected_items(turns: int, max_items: int | None) -> int:
    """Entries one reply is expected to hold: one per turn without a cap (the schema has no
    maxItems), else REPLY_FILL of what the cap allows, at least one."""
    if max_items is None:
        return turns
    return max(1, round(min(turns, max_items) * REPLY_FILL))


def stand_in_entries(windows: Sequence[ExtractionWindow], s: ExtractSettings) -> pl.DataFrame:
    """ENTRIES rows as the stage is expected to write them: per window and perspective, one
    entry for each of its first `expected_items` turns, the turn's text cut to
    max_item_chars (for the dry run's later hooks: the readers' prompts)."""
    rows = [
        {"entry_id": f"{kind}:{t.event_id}:{t.part}", "conv_id": w.conv_id, "event_id": t.event_id,
         "dia_id": t.dia_id, "session_index": t.session_index, "turn_index": t.turn_index,
         "event_time": t.session_time, "speaker": t.speaker, "kind": kind,
         "text": t.text[: s.max_item_chars], "request_id": "", "prompt_version": "", "model": ""}
        for kind in s.perspectives for w in windows
        for t in w.turns[: expected_items(len(w.turns), s.max_items)]
    ]
    return schemas.frame(rows, schemas.ENTRIES)


def estimate_extract(inp: EstimateInputs) -> StageEstimate:
    """Exact: the stage's own windows (`plan_from_settings`) and request builder, so the count
    and the prompts are the job's (with extract.input=compressed | segments the turns are the
    compress/segment stand-ins: approximate). Completion: one item per turn restating it
    (capped by the schema) plus JSON framing, capped at extract.max_tokens."""
    from structmem_gpu.methods.structmem.compress import approximate_compressed, o200k_or_chars

    from structmem_gpu.methods.structmem.segment_settings import SegmentSettings

    from structmem_gpu.methods.load import writes_compact

    s = inp.job.settings(ExtractSettings)
    llm_cfg = inp.job.root.llm
    turns = inp.turns
    if s.input == "turns" and writes_compact(inp.job):  # the stage's per_session_applies path
        turns = sessions_to_extract(turns_store.CompactTurns.from_turns(turns),
                                    s.once_per_content)[1]
    batch_tokens = inp.job.settings(SegmentSettings).batch_tokens if s.input == "segments" else 0
    if s.input != "turns":
        turns = approximate_compressed(inp.job, turns)
    try:
        if s.input == "segments":
            windows, packer = approximate_batches(turns, batch_tokens, o200k_or_chars()[0]), "o200k"
        else:
            windows, packer = plan_from_settings(turns, s, llm_cfg)
        plan: str | None = window_plan_hash(windows)
        missing = None
    except ConfigError as err:
        # The window tokenizer is not on this machine (a login node before `jobs/data.py
        # models`, a CI machine): the job stops on it (preflight); the dry run still plans,
        # by characters / 4, and says these are not the job's windows.
        chars = s.model_copy(update={"window_tokenizer": CHARS})
        windows, packer = plan_from_settings(turns, chars, llm_cfg)
        plan, missing = None, str(err)
    prompt = completion = n = over = 0
    for kind in s.perspectives:
        for w in windows:
            req = build_request(w, kind, s)
            prompt += inp.counter.messages(req.messages)
            over += inp.over(req.messages, req.sampling.max_tokens)
            mean_chars = sum(len(t.text) for t in w.turns) / max(len(w.turns), 1)
            item_tokens = min(mean_chars, s.max_item_chars) / CHARS_PER_TOKEN + 8
            items = len(w.turns) if s.max_items is None else min(len(w.turns), s.max_items)
            completion += int(min(s.max_tokens, 6 + items * item_tokens))
            n += 1
    inp.stand_ins["entries"] = stand_in_entries(windows, s)
    return StageEstimate(
        STAGE_NAME, n, prompt, completion,
        (f"APPROXIMATE ({s.input}: stand-in compression, see compress/segment rows): " if s.input != "turns" else "")
        + f"{len(windows)} windows x {len(s.perspectives)} perspectives (exact prompts"
        + (f"; batches of <= {batch_tokens} {packer} tokens" if s.input == "segments" else
           f"; packed to {s.window_tokens} tokens by {packer}" if s.window_tokens else "")
        + (f"; window plan {plan})" if plan else
           f"; APPROXIMATE: not the job's windows, a real job stops on: {missing})"),
        over if inp.checked else None, plan, build=True,
    )


def reference_texts_fingerprint(job: Any) -> str | None:
    """The official extraction prompts this job's requests send (prompts.sources.lightmem)."""
    s = job.settings(ExtractSettings)
    return texts_fingerprint(s.reference_dir, s.perspectives, s.reference_mode)


STAGE = Stage(
    name=STAGE_NAME,
    run=run_extract,
    reads=("turns",),
    writes=("entries",),
    # extract.input=compressed | segments (fingerprinted when present).
    optional_reads=("compressed_turns", "segments"),
    settings=ExtractSettings,
    depends=LLM_IDENTITY,
    extra_fingerprint=reference_texts_fingerprint,
    uses=("llm",),
    estimate=estimate_extract,
    loads=("window_tokenizer",),  # packs its windows by extract.window_tokenizer
)
