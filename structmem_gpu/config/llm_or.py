"""`${llm_or:KEY,DEFAULT}`: a stage knob that follows the job's llm profile when it says so.

A profile's `llm.budgets` (config.schema.LLMBudgets) holds the reply budgets its model can
afford (the CPU profile caps replies; the GPU profiles leave them to the stage), and
`llm.tokenizer` what counts its tokens. Stage nodes read them through this resolver:

    extract:
      max_tokens: ${llm_or:budgets.extract_max_tokens,4096}   # the profile's budget, else 4096
      window_tokenizer: ${llm_or:tokenizer,chars}

A key the profile leaves null is the stage's own default. That is why this is not
`${oc.select:llm.KEY,DEFAULT}`: oc.select returns a null value as null, and the base llm config
(conf/llm/_base.yaml, generated from the model) lists every key, null where unset, so that every
`llm.KEY=...` override works on every profile without `+`.
"""

from __future__ import annotations

from typing import Any

RESOLVER = "llm_or"


def llm_or(key: str, default: Any = None, *, _root_: Any) -> Any:
    """The job's `llm.<key>` (dotted) when it is set and not null, else `default`."""
    node: Any = _root_
    for part in ("llm", *key.split(".")):
        node = node.get(part) if node is not None and hasattr(node, "get") else None
    return default if node is None else node


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, llm_or)
