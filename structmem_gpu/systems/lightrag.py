"""LightRAG (lightrag-hku 1.5.7): graph RAG over a conversation's sessions, hybrid retrieval.

The worker (systems/workers/lightrag_worker.py) inserts each session as one document
("Session on <time>:" then "<speaker>: <text>" lines), one LightRAG working_dir/workspace per
conversation, and answers a search with the context string of `aquery(mode="hybrid",
only_need_context=True)`: StructMem Appendix A.4 runs LightRAG with hybrid retrieval, top-20.

`prepare(home)` (the job, before workers start) writes tiktoken's o200k_base file into
`<home>/tiktoken`: LightRAG's default tokenizer asks tiktoken for gpt-4o-mini's encoding, which
tiktoken would download. `scripted_reply` answers LightRAG's own prompts without a model (unit
tests, the CI tier). Standard library only at import: this module is imported by our package.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

VERSION = "1.5.7"
# openai is only in LightRAG's [api] extra; without it, importing lightrag.llm.openai makes
# pipmaster `pip install openai` at run time. 3.60.0 is what `pip install lightrag-hku openai`
# resolved (the lock).
REQUIREMENTS = (f"lightrag-hku=={VERSION}", "openai==3.60.0")
ENV = {
    # pipmaster installs a missing binding at import: no index to install from (the worker
    # also replaces pipmaster's install functions by a refusal)
    "PIP_NO_INDEX": "1",
    # LightRAG loads ./.env at import (override=False): its default, pinned so a stray .env
    # cannot switch extraction to the JSON prompts
    "ENTITY_EXTRACTION_USE_JSON": "false",
}

# tiktoken_ext/openai_public.py: the URL (the cache file is named sha1(URL)) and its pin.
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def tiktoken_cache_dir(home: Path) -> Path:
    """`<home>/tiktoken` holding o200k_base under the name tiktoken reads (idempotent). The
    vocabulary comes from quicktok-v1 (our [compress] extra, llm/tiktoken_data.py), written in
    tiktoken's format ("<base64 token> <rank>" lines) and checked against tiktoken's sha256."""
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.llm import tiktoken_data

    cache = Path(home) / "tiktoken"
    target = cache / hashlib.sha1(O200K_URL.encode()).hexdigest()
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == O200K_SHA256:
        return cache
    try:
        import quicktok
    except ImportError:
        raise ConfigError("LightRAG needs the o200k_base vocabulary (tiktoken would download "
                          f"it): {tiktoken_data.INSTALL_HINT}") from None
    enc = quicktok.get_encoding("o200k_base")
    lines = []
    for rank in range(enc.n_vocab):  # ranks 0..199997; the rest are special or unassigned
        if enc.is_special_token(rank):
            continue
        try:
            raw = enc.decode_single_token_bytes(rank)
        except (KeyError, ValueError, RuntimeError):
            continue
        lines.append(base64.b64encode(raw) + b" " + str(rank).encode())
    data = b"\n".join(lines) + b"\n"
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise ConfigError("quicktok's o200k_base differs from tiktoken's pinned file "
                          f"({len(lines)} ranks); LightRAG's token counts would not be gpt-4o-mini's")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return cache


def prepare(home: Path) -> dict[str, str]:
    """Environment additions of the workers (SystemSpec.prepare)."""
    return {"TIKTOKEN_CACHE_DIR": str(tiktoken_cache_dir(home))}


# --- scripted replies ------------------------------------------------------------------

# What identifies each of LightRAG's prompts (lightrag/prompt.py as of 1.5.7).
TUPLE = "<|#|>"
COMPLETE = "<|COMPLETE|>"
_EXTRACT_MARK = "responsible for extracting entities and relationships"
_GLEAN_MARK = "Based on the last extraction task"
_SUMMARY_MARK = "Description List:"
_KEYWORDS_MARK = "You are an expert keyword extractor"
_WORDS = 12
_STOP = frozenset([
    "a", "an", "the", "and", "or", "but", "so", "of", "to", "in", "on", "at", "for", "with",
    "from", "by", "about", "what", "when", "where", "why", "how", "who", "whom", "which", "did",
    "do", "does", "is", "are", "was", "were", "be", "been", "has", "have", "had", "will",
    "would", "can", "could", "should", "i", "you", "he", "she", "it", "we", "they", "my",
    "your", "his", "her", "its", "our", "their", "me", "him", "them", "this", "that", "these",
    "those", "as", "if", "than", "then", "there", "here", "not", "no", "yes",
])


def _input_text(prompt: str) -> str:
    m = re.search(r"---Input Text---\s*```\s*\n(.*?)\n```", prompt, re.DOTALL)
    return m.group(1) if m else ""


def _clean(text: str, words: int = _WORDS) -> str:
    """A description LightRAG's parser keeps: no delimiter characters, one line."""
    return " ".join(re.sub(r"[<|>#\n]", " ", text).split()[:words])


def _extraction(text: str) -> str:
    """Each speaker ("Name: ..." lines) a person; one relation between the first two."""
    said: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Z][\w' .-]{0,40}?): (.+)$", line)
        if m and not line.startswith("Session on "):
            said.setdefault(m.group(1), m.group(2))
    rows = [f"entity{TUPLE}{who}{TUPLE}Person{TUPLE}{who} said: {_clean(first)}"
            for who, first in said.items()]
    names = list(said)
    if len(names) >= 2:
        rows.append(f"relation{TUPLE}{names[0]}{TUPLE}{names[1]}{TUPLE}conversation{TUPLE}"
                    f"{names[0]} told {names[1]}: {_clean(said[names[0]])}")
    return "\n".join([*rows, COMPLETE])


def _keywords(prompt: str) -> dict[str, list[str]]:
    m = re.search(r"User Query: (.*)", prompt)
    words = re.findall(r"[A-Za-z][\w'-]*", m.group(1) if m else "")
    low = [w for w in words if w[0].isupper() and w.lower() not in _STOP]
    high = [w.lower() for w in words if w.lower() not in _STOP and w not in low]
    return {"high_level_keywords": list(dict.fromkeys(high))[:5],
            "low_level_keywords": list(dict.fromkeys(low))[:5]}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of LightRAG's chat bodies (see the module docstring)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    texts = [str(m.get("content") or "") for m in messages]
    system = "\n".join(t for m, t in zip(messages, texts) if m.get("role") == "system")
    last = texts[-1] if texts else ""
    if _KEYWORDS_MARK in last or (body.get("response_format") or {}).get("type") == "json_object":
        return {"content": json.dumps(_keywords(last))}
    if _GLEAN_MARK in last:
        return {"content": COMPLETE}  # nothing missed: no new rows
    if _EXTRACT_MARK in system:
        return {"content": _extraction(_input_text(last))}
    if _SUMMARY_MARK in last:  # one JSON object per description: their texts, joined
        block = re.search(r"Description List:\s*```\s*\n(.*?)\n```", last, re.DOTALL)
        parts = []
        for line in (block.group(1) if block else "").splitlines():
            try:
                parts += [str(v) for v in json.loads(line).values()]  # {"Description": ...}
            except (ValueError, AttributeError):
                continue
        return {"content": _clean("; ".join(parts), 40)}
    return {"content": "A scripted reply."}


SPEC = SystemSpec(
    name="lightrag",
    title="LightRAG",
    requirements=REQUIREMENTS,
    worker="lightrag_worker.py",
    source=f"pypi:lightrag-hku=={VERSION}",
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="hybrid retrieval, top-20 (StructMem Appendix A.4)",
    prepare=prepare,
    options={"mode": "hybrid"},  # QueryParam.mode of every search
)
