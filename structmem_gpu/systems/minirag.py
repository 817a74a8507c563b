"""MiniRAG (HKUDS/MiniRAG, "MiniRAG: Towards Extremely Simple Retrieval-Augmented Generation"):
heterogeneous-graph RAG for small models, a repository release pinned at commit 4fe2fba
(2025-06-04) of its repository.

Its wheel (`minirag-hku` 0.0.2) does not import (no dependencies declared, no `minirag/kg/`),
so `python jobs/data.py systems install minirag` installs the lock (locks/minirag.txt: what its
build and search import; no torch) and exports the pinned commit's tree from
paths.official_dir/minirag.git (not fetched by `jobs/data.py official`: clone
https://github.com/HKUDS/MiniRAG as a bare repository there) into `<env>/src`; the worker
(systems/workers/minirag_worker.py) imports `minirag` from there, never from a copy.

Feeding: as our LightRAG runs (its sibling): one document per session ("Session on <time>:"
then "<speaker>: <text>" lines), one MiniRAG working_dir per conversation; MiniRAG's own
extraction prompt and its one "entities were missed" follow-up per chunk. A question is
MiniRAG's "mini" query (`QueryParam(mode="mini", only_need_context=True)`): its keyword call,
then the entity/relation/chunk retrieval whose context (entities, sources) it would give its
answer prompt, which is the one hit our reader sees. StructMem Appendix A.4 retrieves top-20
for MiniRAG and LightRAG (conf/method/minirag.yaml: system.top_k 20).

`prepare` is LightRAG's (tiktoken's o200k_base made local: MiniRAG counts tokens with
gpt-4o-mini's encoding). `scripted_reply` answers MiniRAG's requests without a model (unit
tests, debug=scripted), telling them apart by their structure: a body with history is the
follow-up; a single message is the extraction when its data block carries a "Text:" field and
the keyword call when it carries a "Query:" field. Standard library only: this module is
imported by our package, not by the worker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.lightrag import _STOP, _WORDS  # the same scripted-reply word rules
from structmem_gpu.systems.lightrag import prepare as _o200k_prepare
from structmem_gpu.systems.spec import SystemSpec

COMMIT = "4fe2fba"
REPOSITORY_URL = "https://github.com/HKUDS/MiniRAG"
# What MiniRAG's build and search import (its requirements.txt lists none of them with a
# version and also pulls accelerate, graspologic, torch via sentence-transformers, document
# readers: never imported on this path, not installed; the worker stubs the imports it never
# calls). Versions as the other systems' locks where they share a package.
REQUIREMENTS = ("openai==3.60.0", "tiktoken==0.14.0", "nano-vectordb==0.0.4.3",
                "networkx==3.6.1", "numpy==2.4.6", "json_repair==0.64.6", "pipmaster==1.2.2",
                "python-dotenv==1.2.4", "tenacity==9.1.4", "nltk==3.10.4", "tqdm==4.70.1")
ENV = {
    # pipmaster installs a missing package at import: no index to install from (the worker
    # also replaces pipmaster's install functions by a refusal)
    "PIP_NO_INDEX": "1",
    # MiniRAG loads ./.env at import (override=False): its defaults, pinned so a stray .env
    # cannot change the vector threshold or the insert batching
    "COSINE_THRESHOLD": "0.2",
    "MAX_PARALLEL_INSERT": "2",
}

# MiniRAG's delimiters (minirag/prompt.py at the pinned commit: DEFAULT_*_DELIMITER).
TUPLE = "<|>"
RECORD = "##"
COMPLETE = "<|COMPLETE|>"


def _data_block(prompt: str) -> str:
    """The prompt's last data block (what follows its last "-Real Data-" header)."""
    return prompt.rsplit("-Real Data-", 1)[-1]


def _field(block: str, name: str) -> str | None:
    """The value of a "<name>: ..." field of a data block, up to the block's closing rule."""
    m = re.search(rf"(?:^|\n){name}: ?(.*?)(?:\n#+\s*\n|\nAnswer type pool:|$)", block, re.DOTALL)
    return m.group(1) if m else None


def _clean(text: str, words: int = _WORDS) -> str:
    """A value MiniRAG's record parser keeps: no delimiter characters, quotes or parentheses,
    one line."""
    return " ".join(re.sub(r"[<|>#()\"\n]", " ", text).split()[:words])


def _record(*fields: str) -> str:
    return "(" + TUPLE.join(f'"{f}"' if not f.isdigit() else f for f in fields) + ")"


def _extraction(text: str) -> str:
    """Each speaker ("Name: ..." lines) a person, the session an event; each speaker related
    to the session, the first two speakers to each other."""
    lines = text.splitlines()
    head = lines[0].strip().rstrip(":") if lines and lines[0].startswith("Session on ") else ""
    said: dict[str, str] = {}
    for line in lines:
        m = re.match(r"^([A-Z][\w' .-]{0,40}?): (.+)$", line)
        if m and not line.startswith("Session on "):
            said.setdefault(m.group(1), m.group(2))
    rows = [_record("entity", who, "person", f"{who} said: {_clean(first)}")
            for who, first in said.items()]
    if head:
        rows.append(_record("entity", head, "event", f"A conversation between {', '.join(said)}"))
        rows += [_record("relationship", who, head, f"{who} took part in it", "conversation", "5")
                 for who in said]
    names = list(said)
    if len(names) >= 2:
        rows.append(_record("relationship", names[0], names[1],
                            f"{names[0]} told {names[1]}: {_clean(said[names[0]])}",
                            "conversation", "7"))
    return RECORD.join(rows) + RECORD + COMPLETE if rows else COMPLETE


def _keywords(query: str) -> dict[str, list[str]]:
    words = re.findall(r"[A-Za-z][\w'-]*", query)
    names = [w for w in words if w[0].isupper() and w.lower() not in _STOP]
    rest = [w.lower() for w in words if w.lower() not in _STOP and w not in names]
    # names alone when there are some: MiniRAG gives up on a question whose *last* entity
    # matches no entity name (_build_mini_query_context checks only that one's results)
    entities = list(dict.fromkeys(names or rest))[:5] or [query.strip() or "conversation"]
    kind = "PERSON" if query.strip().lower().startswith("who") else "EVENT"
    return {"answer_type_keywords": [kind], "entities_from_query": entities}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of MiniRAG's chat bodies (see the module docstring)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    if len(messages) > 1:  # the follow-up: MiniRAG sends the extraction exchange as history
        return {"content": COMPLETE}  # nothing missed: no new records
    block = _data_block(str(messages[-1].get("content") or "") if messages else "")
    first = re.search(r"(?:^|\n)(Text|Query): ", block)  # the data's first field says which
    if first is None:
        return {"content": "A scripted reply."}
    value = _field(block, first.group(1)) or ""
    if first.group(1) == "Query":
        return {"content": json.dumps(_keywords(value.strip().strip('"')))}
    return {"content": _extraction(value.strip())}


SPEC = SystemSpec(
    tier="heavy",  # repository code, not in CI: the heavy tier
    name="minirag",
    title="MiniRAG",
    requirements=REQUIREMENTS,
    worker="minirag_worker.py",
    source=f"git:minirag.git@{COMMIT}",
    repository=("minirag.git", COMMIT),
    repository_url=REPOSITORY_URL,
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="one dated document per session, MiniRAG's \"mini\" retrieval context with "
                   "top-20 (StructMem Appendix A.4: MiniRAG and LightRAG top-20)",
    prepare=_o200k_prepare,
    # mode: QueryParam.mode of every search; one_insert: all sessions in one ainsert (see the
    # worker: each ainsert call re-extracts every document already inserted)
    options={"mode": "mini", "one_insert": True},
)
