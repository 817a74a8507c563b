"""Stage `update`: the reference's offline update (LightMem `update="offline"`;
docs/methods.md "StructMem: offline update"), after consolidate.

    python jobs/run.py experiment=structmem_locomo_reference_code            # on, QA reads pre
    python jobs/run.py experiment=structmem_locomo_reference_code update.read=post

Per conversation (the reference keeps one vector store per conversation), exactly as
`LightMemory.construct_update_queue_all_entries` + `offline_update_all_entries` (8fc9a91):
1. queue: each entry searches the entries whose time is earlier than or equal to its own
   (itself included) for its top `queue_top_k` (20) by cosine, drops itself and keeps the
   first `queue_keep` (10), best first;
2. candidates: an entry that appears with score >= `score_threshold` (0.9) in the queue of some
   other entry; its sources are those entries (each once, in table order);
3. one request per candidate (methods/structmem/prompts/update.py: the LightMem UPDATE_PROMPT from the checkout,
   or our wording): the target's text and its sources' texts; every candidate of every
   conversation goes out in ONE batch, as in the reference every request reads the texts as
   they were before any update (its threads read one snapshot);
4. the reply's action: update = the text is replaced, the vector is NOT recomputed (the
   reference writes the old vector back); delete = the entry leaves retrieval; ignore.

Nothing is rewritten in `entries`: tables/entry_updates records every candidate, keyed by
the entry's original id (entry ids hash their text, so an update never renames an entry):
old and new text, decision, sources, request id. Which store QA reads is `update.read`
(update_view.py): `pre` = the store before the update (the reference script's default QA
directory, with the syntheses), `post` = the updated store (the README's QA command), with
the syntheses only when `post_syntheses` is true (the reference's post store has none).

`update.enabled: false` (the flat reference profile's default) writes an empty table and
sends nothing. ctx.notes: enabled, conversations, entries, queues_nonempty, candidates,
requests, update, delete, ignore, updates_without_text, parse_failures, read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.llm.types import LLMRequest, Sampling, request_id
from structmem_gpu.methods.structmem.embed import attach_embeddings, embedding_matrix
from structmem_gpu.methods.structmem.prompts import update as P
from structmem_gpu.prompts.official import fingerprint as official_fingerprint
from structmem_gpu.prompts.official import lightmem_update, source_spec
from structmem_gpu.config.settings import (
    COUNT,
    External,
    RATE,
    SIZE,
    Settings,
    TEMPERATURE,
    TOKENS,
    TOP_P,
)
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)

# What QA reads after the update (update.read; update_view.py applies it).
READS = ("pre", "post")
STAGE_NAME = "update"


class UpdateSettings(Settings):
    """conf/method/structmem.yaml `update:` (+ prompts.sources.lightmem for the prompt); the
    block is generated from these fields."""

    node: ClassVar[str] = "update"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    enabled: bool = Field(True, description=(
        "The offline update (methods/structmem/update.py), for profiles that list the `update` "
        "stage. false = the stage writes an empty entry_updates table and sends nothing."))
    queue_top_k: SIZE = Field(20, description=(
        "Per entry: its top queue_top_k neighbours by cosine among entries at an earlier or "
        "equal time (itself included, then dropped), queue_keep of them kept (reference: 20, "
        "10). Larger = more candidate pairs, more update requests."))
    queue_keep: COUNT = Field(10, description=(
        "Neighbours kept in an entry's queue after dropping itself (see queue_top_k)."))
    score_threshold: RATE = Field(0.9, description=(
        "An entry becomes a candidate when it reaches this cosine in a later entry's queue "
        "(reference 0.9); lower = more requests and more rewritten or deleted entries."))
    # update_view.py applies it; retrieve and the readers fingerprint it. Hashed like every
    # knob that changes a result; a switch reruns this stage from the response cache.
    read: Literal[READS] = Field("pre", description=(
        "The store QA reads: pre = before the update (the reference script's default QA "
        "directory, syntheses included); post = after it (the reference README's QA command). "
        "Both are what the reference code can do; which one the published numbers read is not "
        "stated."))
    post_syntheses: bool = Field(False, description=(
        "post only: keep the syntheses (true) or not (false = the reference's post store, which "
        "holds none: its consolidation wrote them beside the pre store)."))
    max_tokens: TOKENS = Field(512, description=(
        "Reply budget: an action and at most one rewritten memory (the reference allows 16,000)."))
    max_chars: SIZE = Field(600, description=(
        "JSON-schema bound on the rewritten memory's characters (like extract.max_item_chars)."))
    temperature: TEMPERATURE = Field(0.1, description=(
        "Sampling as the reference's LLM config (temperature 0.1, top_p 0.1, as extract)."))
    top_p: TOP_P = Field(0.1, description=(
        "Nucleus mass of the same sampling (see temperature)."))
    lightmem: Annotated[str | None, External("prompts.sources.lightmem")] = None


@dataclass(frozen=True)
class Candidate:
    conv_id: str
    entry_id: str
    text: str
    sources: tuple[str, ...]  # entry ids, table order
    source_texts: tuple[str, ...]
    max_score: float


def update_queues(
    matrix: np.ndarray, times: np.ndarray, top_k: int, keep: int
) -> list[list[tuple[int, float]]]:
    """Per entry i: [(j, score)] = its top `top_k` by cosine among entries with
    time <= times[i] (i itself included, as the reference's filtered search), minus i, first
    `keep`, best first. Ties keep table order (a stable sort)."""
    n = matrix.shape[0]
    if n == 0:
        return []
    scores = matrix @ matrix.T
    allowed = times[None, :] <= times[:, None]
    out: list[list[tuple[int, float]]] = []
    for i in range(n):
        pool = np.flatnonzero(allowed[i])
        order = pool[np.argsort(-scores[i, pool], kind="stable")][:top_k]
        queue = [(int(j), float(scores[i, j])) for j in order if j != i]
        out.append(queue[:keep])
    return out


def candidates_of(
    conv_id: str,
    ids: list[str],
    texts: list[str],
    queues: list[list[tuple[int, float]]],
    threshold: float,
) -> list[Candidate]:
    """Entries that appear at score >= threshold in another entry's queue, with those entries
    (each source once, table order) as the reference's `candidate_sources`."""
    sources: dict[int, list[int]] = {}
    best: dict[int, float] = {}
    for i, queue in enumerate(queues):
        for j, score in queue:
            if score >= threshold:
                if i not in sources.setdefault(j, []):
                    sources[j].append(i)
                best[j] = max(best.get(j, score), score)
    return [
        Candidate(conv_id, ids[j], texts[j], tuple(ids[i] for i in sorted(src)),
                  tuple(texts[i] for i in sorted(src)), best[j])
        for j, src in sorted(sources.items())
    ]


def plan(entries: pl.DataFrame, emb: pl.DataFrame, s: UpdateSettings) -> tuple[list[Candidate], int]:
    """Every candidate of every conversation, and how many entries got a non-empty queue."""
    joined = attach_embeddings(entries, "entry_id", emb, "entries")
    out: list[Candidate] = []
    nonempty = 0
    for (conv_id,), part in joined.group_by("conv_id", maintain_order=True):
        mat = embedding_matrix(part)
        times = part["event_time"].dt.epoch("us").to_numpy()
        queues = update_queues(mat, times, s.queue_top_k, s.queue_keep)
        nonempty += sum(bool(q) for q in queues)
        out.extend(candidates_of(str(conv_id), part["entry_id"].to_list(),
                                 part["text"].to_list(), queues, s.score_threshold))
    return out, nonempty


def system_prompt(s: UpdateSettings) -> tuple[str, str]:
    """(system message, prompt_version): LightMem's UPDATE_PROMPT when the source is set."""
    if s.lightmem is None:
        return P.SYSTEM, P.VERSION
    text = lightmem_update(s.lightmem)
    return text.text, text.version("update")


def requests_for(cands: list[Candidate], s: UpdateSettings) -> list[LLMRequest]:
    system, version = system_prompt(s)
    samp = Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
    out = []
    for c in cands:
        msgs = P.build_messages(system, c.text, c.source_texts)
        out.append(LLMRequest(
            request_id=request_id(STAGE_NAME, c.conv_id, c.entry_id, version, msgs[-1].content),
            stage=STAGE_NAME, messages=msgs, prompt_version=version, sampling=samp,
            schema=P.schema(s.max_chars), conv_id=c.conv_id,
        ))
    return out


def run_update(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: UpdateSettings = ctx.settings
    ctx.notes.update(enabled=s.enabled, read=s.read, post_syntheses=s.post_syntheses)
    if not s.enabled:
        ctx.notes.update(candidates=0, requests=0)
        return {"entry_updates": schemas.empty(schemas.ENTRY_UPDATES)}
    entries, emb = ctx.read("entries"), ctx.read("entry_embeddings")
    cands, nonempty = plan(entries, emb, s)
    reqs = requests_for(cands, s)
    results = ctx.generate(reqs, desc="update")  # one batch, all conversations
    rows: list[dict[str, Any]] = []
    for c, req, res in zip(cands, reqs, results, strict=True):
        action, new = P.decision(res.data, res.parse_ok)
        rows.append({
            "entry_id": c.entry_id, "conv_id": c.conv_id, "old_text": c.text, "new_text": new,
            "decision": action, "source_entry_ids": list(c.sources), "max_score": c.max_score,
            "request_id": req.request_id, "prompt_version": req.prompt_version,
            "parse_ok": bool(res.parse_ok),
        })
    out = schemas.frame(rows, schemas.ENTRY_UPDATES)
    counts = {a: int((out["decision"] == a).sum()) if out.height else 0 for a in P.ACTIONS}
    ctx.notes.update(
        conversations=entries["conv_id"].n_unique(),
        entries=entries.height,
        queues_nonempty=nonempty,
        candidates=len(cands),
        requests=len(reqs),
        updates_without_text=int(((out["decision"] == "update") & out["new_text"].is_null()).sum())
        if out.height else 0,
        parse_failures=sum(not r.parse_ok for r in results),
        **counts,
    )
    log.info("update: %s", ctx.notes)
    return {"entry_updates": out}


def update_fingerprint(job: Any) -> str | None:
    """The LightMem update prompt's commit and hash when it is used."""
    spec = source_spec(job, "lightmem")
    return None if spec is None else official_fingerprint({"update": lightmem_update(spec)})


# ---- dry run (Stage.estimate) ------------------------------------------------------------

UPDATE_COMPLETION = 60  # {"action": "update", "new_memory": "<one sentence>"}


def estimate_update(inp: EstimateInputs) -> StageEstimate:
    """An UPPER BOUND of one request per entry (the stage sends one per entry that reaches
    update.score_threshold in another's queue), entries estimated at one per turn and
    perspective; each prompt = the update prompt with the turn as target and one candidate
    (the next turn of the conversation)."""
    from structmem_gpu.methods.structmem.extract import ExtractSettings

    s = inp.job.settings(UpdateSettings)
    # The stand-in store after the update: no decisions (the decisions are replies), so
    # update.read=post renders the readers' prompts on the pre store, an upper bound.
    inp.stand_ins["entry_updates"] = schemas.empty(schemas.ENTRY_UPDATES)
    if not s.enabled:
        return StageEstimate(STAGE_NAME, 0, 0, 0, "update.enabled=false", 0, build=True)
    x = inp.job.settings(ExtractSettings)
    system, _ = system_prompt(s)
    per = len(x.perspectives)
    prompt = n = over = 0
    for (_,), part in inp.turns.group_by("conv_id", maintain_order=True):
        texts = [(t or "")[: x.max_item_chars] for t in part["text"].to_list()]
        for i, text in enumerate(texts):
            msgs = P.build_messages(system, text, texts[i + 1 : i + 2] or [text])
            prompt += per * inp.counter.messages(msgs)
            over += per * inp.over(msgs, s.max_tokens)
            n += per
    return StageEstimate(
        STAGE_NAME, n, prompt, n * min(s.max_tokens, UPDATE_COMPLETION),
        "upper bound: every entry a candidate (one per turn and perspective)",
        over if inp.checked else None, bound=True, build=True,
    )


STAGE = Stage(
    name=STAGE_NAME,
    run=run_update,
    reads=("entries", "entry_embeddings"),
    writes=("entry_updates",),
    settings=UpdateSettings,
    depends=(*EMBEDDER_IDENTITY, *LLM_IDENTITY),
    extra_fingerprint=update_fingerprint,
    uses=("llm",),
    estimate=estimate_update,
)
