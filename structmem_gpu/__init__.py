"""structmem_gpu: structured long-term memory for LLM agents, built at GPU batch scale.

Importing the package is cheap: heavy libraries (vllm, faiss, torch, sentence_transformers,
aiohttp) are imported lazily, each by exactly one module.
"""

from structmem_gpu import run_key as _run_key

__version__ = "0.1.0"

# conf/config.yaml names run directories with ${run_key:...}. Registered on import so that a
# submitit worker, which imports this package to unpickle its job, resolves them too.
_run_key.register()
