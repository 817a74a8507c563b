"""Stage `compress`: LLMLingua-2 over every turn of every conversation, as the reference's
pre-compression (LightMem 8fc9a91 `pre_compress: true`, rate 0.6; docs/methods.md
"Compression and topic segmentation").

    python jobs/run.py experiment=structmem_locomo_reference_code stages=[load,compress]

Each turn's message is what the reference's LoCoMo driver builds (the text, plus
" (image description: <caption>)" for an image turn), compressed as LightMem's
`LlmLingua2Compressor.compress` does (methods/structmem/lingua.py), `compress.batch_size`
turns per llmlingua call on the GPU. Off by default (not in method.stages); the segment
stage and `extract.input` read its table.

    tables/compressed_turns.parquet: one row per turn (schemas.COMPRESSED_TURNS)

ctx.notes: turns, compressed (non-empty turns sent), recompressed (passes > 1), errors,
tokens_in / tokens_out (o200k), ratio, model, device, batch_size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, TYPE_CHECKING

from pydantic import Field

import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.config.settings import RATE, RUN_ROLE, SIZE, Settings
from structmem_gpu.llm.tokens import CHARS_PER_TOKEN
from structmem_gpu.stage import EstimateInputs, Stage, StageContext, StageEstimate

if TYPE_CHECKING:
    from structmem_gpu.config.job import JobConfig

if TYPE_CHECKING:
    from structmem_gpu.config.job import JobConfig

log = logging.getLogger(__name__)

STAGE_NAME = "compress"
# The reference's compression model (llmlingua_2 config default; add_locomo points at a local
# copy of it).
REFERENCE_MODEL = "microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank"


class CompressSettings(Settings):
    """conf/method/structmem.yaml `compress:` (generated from these fields)."""

    node: ClassVar[str] = "compress"
    yaml_home: ClassVar[str | None] = "method/structmem.yaml"

    # llmlingua recognises the model family by "bert-base-multilingual-cased" or
    # "xlm-roberta-large" in the name.
    model: str = Field(REFERENCE_MODEL, description=(
        "The reference's model (a token classifier; `python jobs/data.py models` fetches it): "
        "an HF id or local folder of an LLMLingua-2 token classifier."))
    rate: RATE = Field(0.6, description=(
        "Share of tokens kept: the reference's add_locomo 0.6 (its README says 0.8). Lower = "
        "fewer extraction tokens, fewer words for the extractor."))
    recompress: bool = Field(True, description=(
        "Re-compress a result of >= 512 model tokens, as the reference does with segmentation "
        "on (only when the segmenter lends the compressor its tokenizer)."))
    batch_size: Annotated[SIZE, RUN_ROLE] = Field(64, description=(
        "Turns per llmlingua call: more = faster on a GPU and more memory; 1 = the reference's "
        "order of float operations (a larger batch may flip a word lying at its keep threshold)."))
    device: Annotated[Literal["auto", "cuda", "cpu"], RUN_ROLE] = Field("auto", description=(
        "auto = cuda when torch sees one, else cpu."))


def reference_message(text: str | None, caption: str | None) -> str:
    """The reference LoCoMo driver's user message for a turn."""
    text = text or ""
    return f"{text} (image description: {caption})" if caption else text


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch  # already loaded by llmlingua's import chain when this is called

    return "cuda" if torch.cuda.is_available() else "cpu"


def tokenizer_data_fingerprint(job: "JobConfig") -> Any:
    """The tokenizer packages must be installed (the preflight's line when not)."""
    from structmem_gpu.llm.tiktoken_data import INSTALL_HINT, missing

    lacking = missing()
    if lacking:
        raise ConfigError(f"compress/segment need {', '.join(lacking)}: {INSTALL_HINT}")
    return None


def run_compress(ctx: StageContext) -> dict[str, pl.DataFrame]:
    from tqdm.auto import tqdm

    from structmem_gpu.llm.tiktoken_data import o200k_counter
    from structmem_gpu.methods.structmem.lingua import Lingua, compress_texts, release

    s: CompressSettings = ctx.settings
    turns = ctx.read("turns").sort("conv_id", "session_index", "turn_index")
    rows = list(turns.iter_rows(named=True))
    texts = [reference_message(r["text"], r["image_caption"]) for r in rows]
    lingua = Lingua(s.model, resolve_device(s.device), s.batch_size)
    device = str(lingua.compressor.device)
    with tqdm(total=sum(bool(t.strip()) for t in texts), desc="compress", unit="turn",
              mininterval=1.0) as bar:
        out = compress_texts(
            texts,
            lambda batch: lingua.compress_many(batch, s.rate),
            lingua.model_tokens if s.recompress else None,
            s.batch_size,
            bar.update,
        )
    count = o200k_counter()
    table = schemas.frame(
        (
            {
                "conv_id": r["conv_id"], "event_id": r["event_id"],
                "session_index": r["session_index"], "turn_index": r["turn_index"],
                "text": t, "compressed": c.text,
                "text_tokens": count(t), "compressed_tokens": count(c.text),
                "text_model_tokens": lingua.model_tokens(t),
                "compressed_model_tokens": lingua.model_tokens(c.text),
                "passes": c.passes, "error": c.error,
            }
            for r, t, c in zip(rows, texts, out, strict=True)
        ),
        schemas.COMPRESSED_TURNS,
    )
    release(lingua)
    tin, tout = int(table["text_tokens"].sum() or 0), int(table["compressed_tokens"].sum() or 0)
    ctx.notes.update(
        turns=table.height,
        compressed=sum(bool(t.strip()) for t in texts),
        recompressed=int((table["passes"] > 1).sum()),
        errors=int(table["error"].is_not_null().sum()),
        tokens_in=tin,
        tokens_out=tout,
        ratio=round(tout / tin, 4) if tin else None,
        model=s.model,
        rate=s.rate,
        device=device,
        batch_size=s.batch_size,
    )
    log.info("compress: %s", ctx.notes)
    return {"compressed_turns": table}


# ---- dry run (Stage.estimate) ------------------------------------------------------------


def o200k_or_chars() -> tuple[Callable[[str], int], str]:
    """The o200k counter the compressor's volume is measured in, or characters / 4 when
    quicktok-v1 is not installed (the preflight names it)."""
    try:
        from structmem_gpu.llm.tiktoken_data import o200k_counter

        return o200k_counter(), "o200k"
    except ConfigError:
        return (lambda t: (len(t) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN), "chars/4"


def approximate_compressed(job: "JobConfig", turns: pl.DataFrame) -> pl.DataFrame:
    """Each turn's reference message cut to its first `compress.rate` share of words: a
    stand-in of the compression's volume (the model decides which words)."""
    rate = job.settings(CompressSettings).rate

    def cut(text: str) -> str:
        words = text.split()
        return " ".join(words[: math.ceil(rate * len(words))])

    texts = [cut(reference_message(t, c)) for t, c in zip(turns["text"], turns["image_caption"], strict=True)]
    return turns.with_columns(pl.Series("text", texts, pl.String), pl.lit(None, pl.String).alias("image_caption"))


def estimate_compress(inp: EstimateInputs) -> StageEstimate:
    """No LLM: the compression volume (turns and o200k tokens in, about `rate` of them out)."""
    s = inp.job.settings(CompressSettings)
    count, name = o200k_or_chars()
    texts = [reference_message(t, c) for t, c in zip(inp.turns["text"], inp.turns["image_caption"], strict=True)]
    tokens = sum(count(t) for t in texts)
    return StageEstimate(STAGE_NAME, 0, 0, 0,
                         f"no LLM: LLMLingua-2 ({s.model}) over {sum(bool(t.strip()) for t in texts):,} "
                         f"turns, {tokens:,} {name} tokens in, about {int(s.rate * tokens):,} out "
                         f"(rate {s.rate})", 0)


STAGE = Stage(
    name=STAGE_NAME,
    run=run_compress,
    reads=("turns",),
    writes=("compressed_turns",),
    settings=CompressSettings,
    extra_fingerprint=tokenizer_data_fingerprint,
    uses=(),
    estimate=estimate_compress,
    loads=("compression_model",),
)
