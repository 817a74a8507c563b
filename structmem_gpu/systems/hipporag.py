"""HippoRAG 2 (`hipporag` 2.0.0a4): OpenIE knowledge graph + Personalized PageRank over passages.

The worker (systems/workers/hipporag_worker.py) indexes a conversation as SEEM's paper runs
HippoRAG 2 on LoCoMo: one passage per dialogue turn ("<session time> <speaker>: <text>"; SEEM
§4.4: "a passage is one dialogue turn"; §5.1: HippoRAG 2 retrieves the "top-5 chunks"), one HippoRAG save_dir per conversation, and answers a search with `retrieve(questions,
num_to_retrieve=k)`: each retrieved passage is a hit (kind "passage", HippoRAG's doc score).
HippoRAG's own QA step is not run: our answer stage reads the hits.

Its released pins do not install (openai==1.91.1 is not on the index; torch 2.5.1, vllm
0.6.6.post1), so the lock holds what ran: hipporag and gritlm with `--no-deps` beside the
packages its endpoint path imports. Its LLM goes to the front through its OpenAI client
(`llm_base_url`); its embedding model is chosen by name (a name containing "text-embedding" is
its OpenAI client, pointed at the front, which serves our encoder whatever the name).

`scripted_reply` answers HippoRAG's own prompts without a model (unit tests, debug=scripted):
NER (`{"named_entities": [...]}`: the speaker and capitalised words), triple extraction
(`{"triples": [[speaker, "mentioned", entity], ...]}`), the recognition-memory fact filter
(`[[ ## fact_after_filter ## ]]` with up to 4 candidate facts sharing words with the question)
and the QA prompt ("Thought: ... Answer: ..."). Standard library only: this module is imported
by our package, not by the worker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

VERSION = "2.0.0a4"
# What `python jobs/data.py systems lock hipporag` resolves in one pip call (hipporag's own pins
# do not resolve, so it and gritlm come after it, with --no-deps: EXTRA_INSTALLS). The committed
# lock is the freeze of the environment that ran (it holds hipporag and gritlm too).
REQUIREMENTS = (
    "torch==2.13.0", "transformers==4.45.2", "openai==1.91.0", "litellm==1.73.1",
    "networkx==3.4.2", "python-igraph==0.11.8", "tiktoken==0.7.0", "pydantic==2.10.4",
    "tenacity==8.5.0", "einops", "tqdm", "boto3", "pandas", "filelock", "httpx", "packaging",
    "pyarrow",  # not declared by hipporag; its embedding stores are parquet files
)
EXTRA_INSTALLS = (("--no-deps", f"hipporag=={VERSION}", "gritlm==1.0.2"),)
ENV = {
    # litellm (imported by hipporag's Bedrock client) fetches its price map at import otherwise
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}

# What identifies each of HippoRAG's prompts (hipporag/prompts/templates/ner.py,
# triple_extraction.py, rag_qa_musique.py, ner_query.py and rerank.py's DSPy filter, 2.0.0a4).
_NER_MARK = "extract named entities"
_TRIPLE_MARK = "RDF (Resource Description Framework) graph"
_QUERY_NER_MARK = "entity extraction system"
_QA_MARK = "reading comprehension assistant"
_FILTER_IN = "[[ ## fact_before_filter ## ]]"
_QUESTION = "[[ ## question ## ]]"
_MAX_ENTITIES = 6
_MAX_FACTS = 4  # the filter prompt asks for "up to 4 relevant facts"
_STOP = frozenset([
    "I", "I'm", "I've", "I'd", "I'll", "It", "It's", "The", "A", "An", "And", "But", "So", "Oh",
    "Yes", "No", "Hi", "Hey", "Wow", "That", "This", "What", "When", "Where", "Why", "How",
    "Who", "Which", "Do", "Did", "Does", "Are", "Is", "Was", "Were", "Have", "Has", "Had", "My",
    "Me", "We", "You", "Your", "Our", "They", "Thanks", "Thank", "Sure", "Well", "Really",
    "Just", "Question", "Paragraph",
])


def _split_passage(passage: str) -> tuple[str | None, str]:
    """("Caroline", "I went ...") from "<time> Caroline: I went ..." (the worker's format)."""
    head, sep, text = passage.partition(": ")
    if not sep or not head.split():
        return None, passage
    return head.split()[-1], text


def _entities(passage: str) -> list[str]:
    """The speaker, then capitalised words of the text, first seen first, at most 6."""
    speaker, text = _split_passage(passage.strip())
    out = [speaker] if speaker else []
    out += [w for w in re.findall(r"\b[A-Z][\w'-]*", text) if w not in _STOP]
    seen: dict[str, str] = {}
    for e in out:
        seen.setdefault(e.lower(), e)
    return list(seen.values())[:_MAX_ENTITIES]


def _triples(user: str) -> list[list[str]]:
    """Triple-extraction prompt: the paragraph between ``` fences, then its entity JSON."""
    m = re.search(r"```\s*\n(.*?)\n\s*```\s*(\{.*\})", user, re.DOTALL)
    if not m:
        return []
    passage = m.group(1).strip()
    try:
        names = [str(x) for x in json.loads(m.group(2)).get("named_entities") or []]
    except (json.JSONDecodeError, AttributeError):
        names = []
    names = names or _entities(passage)
    if not names:
        return []
    subject = names[0]
    triples = [[subject, "mentioned", other] for other in names[1:]]
    if not triples:
        words = re.findall(r"[\w'-]+", _split_passage(passage)[1])[:6]
        triples = [[subject, "said", " ".join(words) or "something"]]
    return triples


def _section(text: str, header: str) -> str:
    """The text after `header` up to the next `[[ ## ... ## ]]` header (DSPy's field format)."""
    at = text.find(header)
    if at < 0:
        return ""
    rest = text[at + len(header):]
    nxt = re.search(r"\[\[ ## \w+ ## \]\]", rest)
    return (rest[:nxt.start()] if nxt else rest).strip()


def _filter(user: str) -> str:
    """Keep up to 4 candidate facts that share a word with the question (most shared first)."""
    question = set(re.findall(r"\w+", _section(user, _QUESTION).lower()))
    try:
        facts = json.loads(_section(user, _FILTER_IN).split("\n\n", 1)[0]).get("fact") or []
    except (json.JSONDecodeError, AttributeError):
        facts = []
    scored = [(sum(w in question for w in re.findall(r"\w+", " ".join(map(str, f)).lower())), i)
              for i, f in enumerate(facts)]
    keep = [facts[i] for s, i in sorted(scored, key=lambda x: (-x[0], x[1])) if s > 0]
    if not keep and facts:
        keep = facts[:1]
    return ("[[ ## fact_after_filter ## ]]\n" + json.dumps({"fact": keep[:_MAX_FACTS]})
            + "\n\n[[ ## completed ## ]]")


def _answer(user: str) -> str:
    """QA prompt ("Wikipedia Title: <passage>" blocks, then the question): the first passage."""
    m = re.search(r"Wikipedia Title: (.*)", user)
    words = _split_passage(m.group(1))[1].split()[:8] if m else []
    return "Thought: The first passage answers it.\nAnswer: " + (" ".join(words) or "Unknown")


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of HippoRAG's chat bodies (see the module docstring)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
    system = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    last = str(messages[-1].get("content") or "") if messages else ""
    if _FILTER_IN in last:
        return {"content": _filter(last)}
    if _TRIPLE_MARK in system:
        return {"content": json.dumps({"triples": _triples(last)})}
    if _NER_MARK in system:
        return {"content": json.dumps({"named_entities": _entities(last)})}
    if _QUERY_NER_MARK in system:
        question = last.split("Question:", 1)[-1]
        return {"content": json.dumps({"named_entities": _entities(": " + question)})}
    if _QA_MARK in system:
        return {"content": _answer(last)}
    return {"content": "A scripted reply."}


SPEC = SystemSpec(
    tier="heavy",  # 1.5 GB environment / repository code: the heavy tier
    name="hipporag",
    title="HippoRAG 2",
    requirements=REQUIREMENTS,
    worker="hipporag_worker.py",
    source=f"pypi:hipporag=={VERSION}",
    env=ENV,
    extra_installs=EXTRA_INSTALLS,
    scripted_reply=scripted_reply,
    paper_settings="one passage per dialogue turn, top-5 passages (SEEM §4.4/§5.1: "
                   "\"top-5 chunks\"); HippoRAG 2's defaults otherwise (linking top-5 facts, "
                   "PPR damping 0.5, passage node weight 0.05)",
)
