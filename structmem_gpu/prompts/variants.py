"""Prompt variants of the extraction perspectives (`extract.prompt_variant`).

`default` follows the reference prompts (specs/structmem-reference.md §3.4-§3.5) in our own
words; `grounded` is our stricter wording (computed absolute dates, no inference, relational
causes and co-participation), opt-in.
"""

from __future__ import annotations

from structmem_gpu.errors import ConfigError

EXTRACTION_VARIANTS = ("default", "grounded")


def check_extraction_variant(variant: str) -> None:
    if variant not in EXTRACTION_VARIANTS:
        raise ConfigError(
            f"extract.prompt_variant={variant!r}; expected one of {list(EXTRACTION_VARIANTS)}"
        )
