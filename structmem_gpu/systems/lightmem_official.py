"""LightMem's own StructMem pipeline (zjunlp/LightMem at the pinned commit 8fc9a91, the code
behind the published StructMem numbers), run as a baseline system beside our port of it.

`python jobs/data.py systems install lightmem_official` installs the lock (LightMem's
pyproject pins, torch 2.13.0+cpu in place of its CUDA torch 2.8.0, and spacy, which its
LoCoMo retrievers import) and exports the pinned tree from paths.official_dir/lightmem.git into
`<env>/src`. The worker (systems/workers/lightmem_official_worker.py) imports LightMem's LoCoMo
build driver (experiments/locomo/add_locomo.py) and calls its `process_single_sample` per
conversation, unchanged: every turn `add_memory` (LLMLingua-2 compression, topic segmentation,
factual + relational extraction in 512-token batches), the pre-store copy, `summarize` (3600-s
windows, 15 seeds) and the offline update; per question, its search driver's retrieval
(experiments/locomo/search_locomo.py: `retrieve_combined` top-60 entries + `retrieve_summaries`
top-5, the readme's StructMem command). Our reader and judge answer, so the run compares with
`experiment=structmem_locomo_reference_code` request by request (`jobs/report.py
differential`).

What the worker changes, and why (each visible in the worker's docstring):
- the driver's module constants (model paths, store directories, API base URL) are set per
  conversation, as its readme asks a user to edit them;
- `device_map="cuda"` becomes the job's device (the CPU profile has none);
- the text embedder is LightMem's own `openai` embedder pointed at the front (our encoder), in
  place of a local `huggingface` model path: both runs then embed with the same encoder;
- each LightMem call is attributed to its step by the URL path (build.extract,
  build.consolidate, build.update, search.retrieve), so the differential compares per stage.

`system.options.read` says which store the search reads: "pre" (the default: the syntheses
live beside the pre-update store, as our reference profile's update.read=pre) or "post" (the
readme's QA command's directory, where the syntheses are not found).

Standard library only: this module is imported by our package, not by the worker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from structmem_gpu.systems.lightrag import tiktoken_cache_dir
from structmem_gpu.systems.spec import SystemSpec

COMMIT = "8fc9a91"
# LightMem's pyproject.toml pins at COMMIT, less torch==2.8.0 (a CUDA build on PyPI; the CPU
# build on the registry is 2.13.0+cpu) and vllm/ollama (optional extras the driver never
# imports); plus spacy, which experiments/locomo/retrievers.py imports without declaring it.
REQUIREMENTS = (
    "torch==2.13.0", "transformers==4.57.0", "sentence-transformers==5.1.1",
    "accelerate==1.10.1", "openai==2.3.0", "tiktoken==0.12.0", "llmlingua==0.2.2",
    "qdrant-client==1.15.1", "pydantic==2.12.0", "numpy==2.2.6", "scipy==1.15.3",
    "scikit-learn==1.7.2", "nltk==3.9.2", "tokenizers==0.22.1", "huggingface-hub==0.35.3",
    "safetensors==0.6.2", "tqdm==4.67.1", "PyYAML==6.0.3", "requests==2.32.5", "httpx==0.28.1",
    "networkx==3.4.2", "rank-bm25==0.2.2", "spacy",
)
# (every worker runs hub-offline: the LLMLingua-2 model is a local path or in the HF cache)
ENV = {"TOKENIZERS_PARALLELISM": "false"}
# The settings of the readme's StructMem commands (experiments/locomo/readme.md: add_locomo.py
# --extraction_mode event --enable_summary --summary_time_window 3600 --summary_top_k 15;
# search_locomo.py --total-limit 60 --retrieval-mode combined --enable-summary
# --summary-limit 5), each a worker option (conf/method/lightmem_official.yaml system.options).
OPTIONS = {
    "extraction_mode": "event",
    "enable_summary": True,
    "summary_time_window": 3600,
    "summary_top_k_seeds": 15,
    "summary_limit": 5,
    "read": "pre",
    # add_locomo's LLMLINGUA_MODEL_PATH: a local folder or a name in the HF cache (offline)
    "llmlingua_model": "microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank",
    "device": "auto",  # add_locomo's "cuda"; auto = cuda when torch sees one, else cpu
    "llm_model": "gpt-4o-mini",  # add_locomo's LLM_MODEL (the front serves the job's model)
}



def prepare(home: Path) -> dict[str, str]:
    """The workers' tiktoken cache (SystemSpec.prepare): o200k_base for LightMem's
    "gpt-4o-mini" token counts (as for LightRAG) and cl100k_base, which llmlingua's
    PromptCompressor loads at construction; both from our packages, never downloaded."""
    from structmem_gpu.llm import tiktoken_data

    cache = tiktoken_cache_dir(home)
    tiktoken_data.seed_cl100k(cache)
    return {"TIKTOKEN_CACHE_DIR": str(cache)}


# --- scripted replies ------------------------------------------------------------------

# What tells LightMem's requests apart (src/lightmem at the pinned commit): extraction sends
# numbered "--- Topic <n> ---" blocks in JSON mode; consolidation's system line names a
# summarization assistant; the offline update's user message starts "Target memory:".
_TOPIC = "--- Topic "
_LINE = re.compile(r"^(?:\[[^\]]*\] )?(\d+)\.([^:]+): (.*)$")
_UPDATE = "Target memory:"


def _messages(body: Mapping[str, Any]) -> tuple[str, str]:
    msgs = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    system = "\n".join(str(m.get("content") or "") for m in msgs if m.get("role") == "system")
    user = "\n".join(str(m.get("content") or "") for m in msgs if m.get("role") == "user")
    return system, user


def _extraction(system: str, user: str) -> dict[str, Any]:
    """One item per numbered line: its source id and its words; the relational prompt's
    items are "relation"s (its output example names that key), the factual one's "fact"s."""
    key = "relation" if '"relation"' in system else "fact"
    data = []
    for line in user.splitlines():
        m = _LINE.match(line.strip())
        if m:
            words = m.group(3).split()[:12]
            data.append({"source_id": int(m.group(1)),
                         key: f"{m.group(2).strip()} said: {' '.join(words)}"})
    return {"data": data}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of LightMem's chat bodies (see the comments above)."""
    system, user = _messages(body)
    if user.startswith(_UPDATE):
        return {"content": json.dumps({"action": "ignore"})}
    if _TOPIC in user:
        return {"content": json.dumps(_extraction(system, user))}
    if "summarization assistant" in system:
        lines = [ln.strip() for ln in user.splitlines() if ln.strip()]
        return {"content": "Summary: " + " ".join(" ".join(lines[-3:]).split()[:40])}
    return {"content": "{}"}


SPEC = SystemSpec(
    tier="heavy",  # torch + LLMLingua-2 + qdrant: the heavy tier
    name="lightmem_official",
    title="StructMem (official code)",
    requirements=REQUIREMENTS,
    worker="lightmem_official_worker.py",
    source=f"git:lightmem.git@{COMMIT}",
    repository=("lightmem.git", COMMIT),
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="the readme's StructMem commands: event extraction, summaries (3600-s "
                   "windows, 15 seeds), top-60 entries + top-5 summaries from the pre-update "
                   "store (system.options.read=post: the QA command's directory)",
    options=OPTIONS,
    prepare=prepare,
)
