"""structmem_gpu: structured long-term memory for LLM agents, built at GPU batch scale.

Importing the package is cheap: heavy libraries (vllm, faiss, torch, sentence_transformers,
aiohttp) are imported lazily, each by exactly one module.
"""

from importlib.util import find_spec as _find_spec

__version__ = "0.1.0"

# conf/config.yaml names run directories with ${run_key:...}. Registered on import so that a
# submitit worker, which imports this package to unpickle its job, resolves them too. The vLLM
# CPU environment (.venv-vllm) runs only llm/convert.py and has no omegaconf: nothing to register.
if _find_spec("omegaconf") is not None:
    from omegaconf import OmegaConf as _OmegaConf

    from structmem_gpu.config import llm_or as _llm_or
    from structmem_gpu.config import run_key as _run_key
    from structmem_gpu.prompts import pinned as _pinned

    _run_key.register()
    _llm_or.register()  # ${llm_or:KEY,DEFAULT} of the stage nodes (conf/method/*.yaml)
    # ${official_source:NAME,DIR}: the pinned official checkouts (registered here, the one
    # module outside config/ that touches OmegaConf, so prompts/ stays free of it).
    if not _OmegaConf.has_resolver(_pinned.RESOLVER):
        _OmegaConf.register_new_resolver(_pinned.RESOLVER, _pinned.source)

# `llm.backend` names a module of llm/backends/ (each registers itself there); the settings
# (config/, a lower layer) validate it through this one connection.
from structmem_gpu.config import choices as _choices  # noqa: E402
from structmem_gpu.llm import backends as _backends  # noqa: E402

_choices.provide("llm.backend", _backends.names)
