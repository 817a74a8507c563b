"""Prompt variants of the extraction perspectives (`extract.prompt_variant`).

`default` follows the reference prompts (docs/methods.md "StructMem: extraction") in our own
words; `grounded` is our stricter wording (computed absolute dates, no inference, relational
causes and co-participation), opt-in.
"""

from __future__ import annotations

from structmem_gpu.core.errors import ConfigError

EXTRACTION_VARIANTS = ("default", "grounded")


def check_extraction_variant(variant: str) -> None:
    if variant not in EXTRACTION_VARIANTS:
        raise ConfigError(
            f"extract.prompt_variant={variant!r}; expected one of {list(EXTRACTION_VARIANTS)}"
        )


def variant_system(variant: str, example: bool, *, default: str, no_example: str,
                   grounded: str) -> str:
    """The system prompt of an extraction variant; `example=False` leaves the worked example
    out of the default (extract.worked_example). Shared by factual.py and relational.py."""
    check_extraction_variant(variant)
    if variant == "grounded":
        return grounded
    return default if example else no_example


def variant_version(base: str, variant: str, example: bool) -> str:
    """`base` (default), `base+grounded` or `base+noexample`: recorded on requests and entries."""
    check_extraction_variant(variant)
    if variant == "grounded":
        return f"{base}+grounded"
    return base if example else f"{base}+noexample"
