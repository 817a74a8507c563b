"""structmem_gpu: structured long-term memory for LLM agents, built at GPU batch scale.

Importing the package is cheap: heavy libraries (vllm, faiss, torch, sentence_transformers,
aiohttp) are imported lazily, each by exactly one module.
"""

__version__ = "0.1.0"
