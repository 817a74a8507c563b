"""LLMLingua-2 over many texts at once (the `compress` and `segment` stages' model).

The one module that imports llmlingua (and through it torch/transformers), lazily.

What LightMem's `LlmLingua2Compressor.compress` does to one message (8fc9a91,
`factory/pre_compressor/llmlingua_2.py`), reproduced by `compress_texts` for many:
1. an empty or blank content is left as it is;
2. `compress_prompt(context=[content], instruction="", rate=R, target_token=-1)`; an error
   keeps the original content;
3. while the result has >= 512 tokens of the model's tokenizer (special tokens included) and
   is not blank, compress the result again (an error stops the loop, keeping the last result);
4. the message becomes the stripped result, unless that is blank (the content stays as is).

LLMLingua-2 keeps words per 512-token chunk (a chunk's own keep threshold: the percentile of
its words' keep probabilities, each word weighted by its cl100k token count), so many texts
can share one forward pass: `compress_prompt_llmlingua2` over a list of contexts with the
context-level filter off returns each context's compression, its chunks batched
`max_batch_size` at a time. Every chunk is padded to 512 tokens whatever the batch, so a batch
changes only the floating-point order of the GPU kernels: a word whose probability lies
within that noise of its chunk's threshold may flip (the "ties at the keep threshold" that
tests/unit/test_compress_reference.py measures against batch size 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

RECOMPRESS_AT = 512  # the reference's hard-coded re-compression length (model tokens)


@dataclass
class Compressed:
    text: str  # what the turn's message holds afterwards
    passes: int  # compress_prompt calls that succeeded (0 = empty input or a first-pass error)
    error: str | None  # the first error met (the reference prints it and goes on)


class Lingua:
    """An llmlingua `PromptCompressor` in LLMLingua-2 mode (model on `device`)."""

    def __init__(self, model: str, device: str, max_batch_size: int) -> None:
        from structmem_gpu.llm.tiktoken_data import seed_cl100k

        seed_cl100k()  # the constructor asks tiktoken for cl100k: from the package, never fetched
        from llmlingua import PromptCompressor

        from pathlib import Path

        from structmem_gpu.core.errors import ConfigError

        self.model_name = model
        # A hub id loads from the local cache only (the preflight and `jobs/data.py models`
        # see to it that it is there); a folder as is.
        local = {} if Path(model).expanduser().is_dir() else {"local_files_only": True}
        try:
            self.compressor = PromptCompressor(
                model_name=str(Path(model).expanduser()) if not local else model,
                device_map=device,
                model_config=local,
                use_llmlingua2=True,
                llmlingua2_config={"max_batch_size": max_batch_size, "max_force_token": 100},
            )
        except OSError as exc:
            raise ConfigError(f"compress.model={model!r} cannot be loaded from this machine "
                              f"({str(exc).splitlines()[0]}); fetch it with "
                              "`python jobs/data.py models <the same overrides>`") from None

    @property
    def tokenizer(self) -> Any:
        return self.compressor.tokenizer

    @property
    def model(self) -> Any:
        return self.compressor.model

    def model_tokens(self, text: str) -> int:
        """Tokens as the reference counts them (`tokenizer.encode`, special tokens included)."""
        return len(self.tokenizer.encode(text))

    def compress_many(self, texts: Sequence[str], rate: float) -> list[str]:
        """Each text compressed as `compress_prompt(context=[text], rate=rate)` would."""
        out = self.compressor.compress_prompt_llmlingua2(
            list(texts), rate=rate, target_token=-1, use_context_level_filter=False
        )
        return list(out["compressed_prompt_list"])


def compress_texts(
    texts: Sequence[str],
    compress_many: Callable[[Sequence[str]], list[str]],
    model_tokens: Callable[[str], int] | None,
    batch: int,
    progress: Callable[[int], None] | None = None,
) -> list[Compressed]:
    """The reference's per-message compression (module docstring) for every text, `batch`
    texts per llmlingua call; `model_tokens` None = no re-compression loop (the reference
    without a tokenizer, i.e. with topic segmentation off)."""
    state = [Compressed(t, 0, None) for t in texts]
    todo = [i for i, t in enumerate(texts) if t and t.strip()]
    current = {i: texts[i] for i in todo}
    first = True
    while todo:
        ok = _run(todo, current, compress_many, batch, state, first, progress if first else None)
        # after the first pass every text may go again (a failed first pass keeps the
        # original, which the reference's loop still re-compresses when long); after a
        # later pass only those that succeeded (an error ends the reference's loop)
        done = todo if first else ok
        first = False
        todo = [i for i in done
                if model_tokens is not None and current[i].strip()
                and model_tokens(current[i]) >= RECOMPRESS_AT]
    for i in current:
        if current[i].strip():
            state[i].text = current[i].strip()
    return state


def _run(
    todo: list[int],
    current: dict[int, str],
    compress_many: Callable[[Sequence[str]], list[str]],
    batch: int,
    state: list[Compressed],
    first: bool,
    progress: Callable[[int], None] | None,
) -> list[int]:
    """One compression pass over `todo`; the indices that succeeded (they may go again)."""
    ok = []
    for start in range(0, len(todo), batch):
        part = todo[start : start + batch]
        try:
            results = compress_many([current[i] for i in part])
        except Exception:  # noqa: BLE001 - find the message(s) that fail, one at a time
            results = None
        for k, i in enumerate(part):
            if results is not None:
                out: str | None = results[k]
            else:
                try:
                    out = compress_many([current[i]])[0]
                except Exception as e:  # noqa: BLE001 - the reference keeps the text, recorded here
                    out = None
                    state[i].error = state[i].error or f"{type(e).__name__}: {e}"
                    log.warning("compress: pass %d of text %d failed (%s); kept %s",
                                state[i].passes + 1, i, e, "the original" if first else "the last result")
            if out is not None:
                current[i] = out
                state[i].passes += 1
                ok.append(i)
        if progress is not None:
            progress(len(part))
    return ok


def release(lingua: Lingua) -> None:
    """Drop the model and hand its CUDA memory back (a server may start next)."""
    import gc
    import sys

    lingua.compressor = None  # type: ignore[assignment]
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
