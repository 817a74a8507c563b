"""A chat request's prompt tokens as a model counts them, without a server: `TokenCounter`,
and llama.cpp's own count from a GGUF's vocabulary and chat template (`gguf_counter`). The
llama.cpp backend (llm/backends/llamacpp.py) offers it to the dry run (node/dry_run.py)."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence

from structmem_gpu.llm.types import Message

log = logging.getLogger(__name__)

# A single newline between two non-blank characters: where gguf_counter cuts a prompt.
_LINE_START = re.compile(r"(?<=\S\n)(?=\S)")


class TokenCounter:
    """Counts the tokens of a chat request: a HF tokenizer with its chat template, or chars/4."""

    def __init__(self, name: str, count: Callable[[Sequence[Message]], int]) -> None:
        self.name = name
        self._count = count

    def messages(self, messages: Sequence[Message]) -> int:
        return self._count(messages)


def gguf_counter(model: str | None) -> TokenCounter | None:
    """Prompt tokens as llama.cpp counts them (llama-cpp-python's usage.prompt_tokens): the
    GGUF's chat template rendered (Jinja2ChatFormatter, as the server does) and tokenized with
    special tokens and no extra BOS, from the GGUF's vocabulary alone (no weights loaded).
    None when llama_cpp or the file is not on this machine (model null = the packaged SmolLM2)."""
    try:
        return _gguf_counter(model)
    except (ImportError, OSError, ValueError, RuntimeError) as err:
        log.debug("dry run: no GGUF tokenizer for %r (%s); characters / 4", model, err)
        return None


@functools.lru_cache(maxsize=4)
def _gguf_counter(model: str | None) -> TokenCounter:
    from pathlib import Path

    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    if model is None:
        from structmem_gpu.llm.server import packaged_smollm2_gguf

        model = str(packaged_smollm2_gguf())
    if not Path(model).is_file():
        raise OSError(f"{model}: no such GGUF file")
    vocab = Llama(model_path=model, vocab_only=True, verbose=False)
    template = vocab.metadata.get("tokenizer.chat_template")
    if not template:
        raise ValueError(f"{model}: the GGUF has no chat template")

    def text(token: int) -> str:
        return vocab._model.token_get_text(token) if token != -1 else ""

    fmt = Jinja2ChatFormatter(template=template, eos_token=text(vocab.token_eos()),
                              bos_token=text(vocab.token_bos()))

    @functools.lru_cache(maxsize=1 << 18)
    def line_tokens(line: str) -> int:
        return len(vocab.tokenize(line.encode("utf-8"), add_bos=False, special=True))

    def count(messages: Sequence[Message]) -> int:
        result = fmt(messages=[{"role": m.role, "content": m.content} for m in messages])
        bos = 0 if result.added_special or vocab.token_bos() == -1 else 1
        # Line by line, each line's count cached: the same memory lines recur in thousands of
        # reader prompts, and tokenizing whole prompts took 50 s on LoCoMo's 1,540 questions
        # (2 cores). Cut only at a single newline between non-blank characters, which the
        # pre-tokenizer splits anyway (runs of newlines and indents stay in one piece, as
        # they tokenize differently alone), so the sum is the whole prompt's count.
        return bos + sum(line_tokens(piece) for piece in _LINE_START.split(result.prompt))

    return TokenCounter(f"gguf:{Path(model).name}", count)
