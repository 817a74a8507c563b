"""Token counting by a configured tokenizer: `chars` (characters / 4) or an HF tokenizer that
is on this machine (a local folder, or an HF id already in the local cache; never downloaded).

    count = text_counter("chars")                     # -> TextCounter("chars", ...)
    count = text_counter("/models/Qwen2.5-7B-Instruct", key="extract.window_tokenizer")
    count("Tomas: I adopted a beagle.")               # -> 8

A tokenizer that is named but not on disk is a ConfigError naming the key and the fix (fetch
it, or choose `chars`): counting by chars/4 instead would cut different windows on a machine
without the tokenizer (docs/methods.md "Extraction windows").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import ConfigError

CHARS = "chars"
CHARS_PER_TOKEN = 4
FETCH_HINT = "python jobs/data.py models <the same overrides>"


def chars_tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class TextCounter:
    """`name` says what counts (`chars` or the tokenizer's id/path), recorded in the manifest."""

    name: str
    count: Callable[[str], int]
    tokenizer: Any = None  # the HF tokenizer, None for chars

    def __call__(self, text: str) -> int:
        return self.count(text)

    def messages(self, messages: Sequence[Any]) -> int:
        """Prompt tokens of a chat request: the chat template when the tokenizer has one,
        else the contents plus 4 per message (role markers)."""
        tok = self.tokenizer
        msgs = [m.as_dict() for m in messages]
        if tok is not None and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return len(ids)
        if tok is None:
            return sum(len(m["content"]) for m in msgs) // CHARS_PER_TOKEN + 4 * len(msgs)
        return sum(self.count(m["content"]) + 4 for m in msgs)


CHARS_COUNTER = TextCounter(CHARS, chars_tokens)


@functools.lru_cache(maxsize=8)
def _load(spec: str, revision: str | None) -> Any:
    from transformers import AutoTokenizer

    path = Path(spec).expanduser()
    return AutoTokenizer.from_pretrained(
        str(path) if path.is_dir() else spec, local_files_only=True, revision=revision
    )


def text_counter(
    spec: str | None, revision: str | None = None, *, key: str = "extract.window_tokenizer"
) -> TextCounter:
    """The counter `spec` names; ConfigError (one line, naming `key`) when it is not local."""
    if spec is None or str(spec) == CHARS:
        return CHARS_COUNTER
    spec = str(spec)
    if spec.endswith(".gguf"):
        raise ConfigError(
            f"{key}={spec!r} is a GGUF file, not a tokenizer: use {CHARS!r} (llama.cpp profiles) "
            "or an HF tokenizer id / folder"
        )
    try:
        tok = _load(spec, revision)
    except ImportError as e:
        raise ConfigError(
            f"{key}={spec!r} needs the transformers package ({e}); install it or set {key}={CHARS}"
        ) from None
    except (OSError, ValueError) as e:
        path = Path(spec).expanduser()
        if path.is_dir():
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        elif spec.startswith((".", "/", "~")) or path.exists():
            reason = "no such folder"
        else:
            reason = "not in the local Hugging Face cache"
        raise ConfigError(
            f"{key}={spec!r}: tokenizer not available locally ({reason}); fetch it with "
            f"`{FETCH_HINT}` or set {key}={CHARS} (characters / 4)"
        ) from None
    return TextCounter(spec, lambda t: len(tok.encode(t, add_special_tokens=False)), tok)


def optional_counter(spec: str | None, revision: str | None = None) -> TextCounter | None:
    """The tokenizer when it is local, else None (for estimates that have a fallback)."""
    try:
        return text_counter(spec, revision)
    except ConfigError:
        return None
