"""Zep worker (its open engine, graphiti-core): `<systems_dir>/zep/bin/python zep_worker.py`.

Runs graphiti-core's `Graphiti` over a Kùzu file per conversation, from its own environment
(systems/protocol.py). Every LLM, reranker and embedding call goes to the request's `base_url`
(the job's recording front): chat through graphiti's `OpenAIGenericClient` (chat completions;
its `OpenAIClient` uses /v1/responses, which the front does not serve), embeddings through its
`OpenAIEmbedder`, the cross-encoder through its `OpenAIRerankerClient` (one logprob call per
candidate fact).

Feeding follows Zep's LoCoMo harness in mem0's evaluation (evaluation/src/zep/add.py,
search.py), with graphiti's open API in place of Zep Cloud's:
- one graph partition (group id) per conversation, as the harness adds every message of a
  conversation to one Zep user/session;
- one episode per message, in conversation order, as its `memory.add(messages=[one])`; the
  message is the harness's (role = the speaker, role_type "user", content
  "<session date>: <text>"), turned into an episode the way graphiti's own REST server turns
  a Zep-style message into one (`"<role>(<role_type>): <content>"`, EpisodeType.message), with
  `reference_time` = the session's date (the harness's Zep Cloud used the time of the call);
- search: facts (edges) by graphiti's hybrid search reranked by the cross-encoder and entities
  (nodes) by hybrid search with RRF, as the harness's two `graph.search` calls
  (`reranker="cross_encoder", scope="edges"` and `reranker="rrf", scope="nodes"`), here one
  `search_()` with both configs (one query embedding); `k` of each (the harness: 20).

Memories are the graph's facts (kind "memory", created_at = the fact's valid_at, else its
episode's reference time) and entities (kind "entity", "<name>: <summary>", as the harness's
context lists them). A hit carries graphiti's reranker score.

Settings (hello's `settings`): `top_k` (10), `llm_attempts` (4: graphiti's tenacity retry of
an unparseable reply; its 5-120 s random back-off is removed, a retry of the same body is a
cache hit at the front anyway), `max_coroutines` (graphiti's concurrency, None = its default).

Drops: an episode whose add_episode raised (graphiti raises on a reply that is not JSON after
its retries, and on JSON with wrong keys at once) is lost whole: where "episode", why the
exception type. graphiti's own log lines for facts it skipped are counted too (DROP_RULES).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "zep"
log = logging.getLogger("structmem.worker")

_EDGE_OPS = "graphiti_core.utils.maintenance.edge_operations"
DROP_RULES = [
    (_EDGE_OPS, "Skipping edge with empty source or target entity name", "fact",
     "empty entity name"),
    (_EDGE_OPS, "Could not find source or target node for extracted edge", "fact",
     "entity not found"),
]
GRAPH_FILE = "graph.kuzu"
ROLE_TYPE = "user"  # the harness's Message(role=<speaker>, role_type="user", ...)

_state: dict[str, Any] = {"settings": {}, "g": None, "drops": None}


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["g"] is not None:
        return {}
    _state["settings"] = dict(req.get("settings") or {})
    clock = req.get("clock")
    if not clock:
        raise ValueError("hello needs a clock (graphiti stamps nodes and edges with now())")
    wc.freeze_clock(str(clock))
    # graphiti binds `from uuid import uuid4` at import: the seeded generator must be in place
    # first (each unit reseeds it).
    wc.seed_ids("hello")
    os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"  # PostHog, read at capture time
    wc.refuse_network()
    import graphiti_core
    import tenacity
    from graphiti_core import Graphiti
    from graphiti_core.cross_encoder.openai_reranker_client import OpenAIRerankerClient
    from graphiti_core.driver.driver import GraphProvider
    from graphiti_core.driver.kuzu_driver import KuzuDriver
    from graphiti_core.edges import EntityEdge
    from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig
    from graphiti_core.graph_queries import get_fulltext_indices
    from graphiti_core.llm_client.client import LLMClient
    from graphiti_core.llm_client.config import LLMConfig
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
    from graphiti_core.nodes import EntityNode, EpisodeType
    from graphiti_core.search import search_config_recipes as recipes
    from graphiti_core.search.search_config import SearchConfig

    # graphiti retries a reply that is not JSON 4 times with a 5-120 s random back-off
    # (~35 s per lost episode): keep its attempts, drop the wait.
    retrying = LLMClient._generate_response_with_retry.retry  # type: ignore[attr-defined]
    retrying.wait = tenacity.wait_none()
    attempts = max(1, int(_state["settings"].get("llm_attempts", 4)))
    retrying.stop = tenacity.stop_after_attempt(attempts)
    _state["g"] = {
        "Graphiti": Graphiti, "KuzuDriver": KuzuDriver, "GraphProvider": GraphProvider,
        "fts": get_fulltext_indices, "LLMConfig": LLMConfig, "LLM": OpenAIGenericClient,
        "Embedder": OpenAIEmbedder, "EmbedderConfig": OpenAIEmbedderConfig,
        "Reranker": OpenAIRerankerClient, "EntityEdge": EntityEdge, "EntityNode": EntityNode,
        "EpisodeType": EpisodeType, "SearchConfig": SearchConfig, "recipes": recipes,
    }
    # KuzuDriver warns at every construction (one per unit) that Kùzu is deprecated upstream
    warnings.filterwarnings("ignore", message="The Kuzu backend is deprecated")
    _state["drops"] = wc.DropCounter(DROP_RULES)
    logging.getLogger(_EDGE_OPS).addHandler(_state["drops"])
    for noisy in ("httpx", "httpx2", "graphiti_core.telemetry"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return {"version": getattr(graphiti_core, "__version__", None) or _version()}


# --- the conversation as the harness feeds it --------------------------------------------


def _when(value: Any) -> dt.datetime | None:
    """The session's date: ISO (our payloads) or LoCoMo's "1:56 pm on 8 May, 2023"."""
    if not value:
        return None
    text = str(value).strip()
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            when = dt.datetime.strptime(text, "%I:%M %p on %d %B, %Y")
        except ValueError:
            return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _locomo_date(when: dt.datetime | None, raw: Any) -> str:
    """The date as LoCoMo writes it (the harness puts `<date_time>: ` before each text)."""
    if when is None:
        return str(raw or "")
    hour = when.hour % 12 or 12
    return f"{hour}:{when.minute:02d} {'am' if when.hour < 12 else 'pm'} on {when.day} " \
           f"{when.strftime('%B')}, {when.year}"


def _episodes(req: dict[str, Any]) -> list[dict[str, Any]]:
    """One episode per message, in conversation order."""
    out = []
    for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
        when = _when(session.get("session_time"))
        stamp = _locomo_date(when, session.get("session_time"))
        for turn in session["turns"]:
            content = f"{stamp}: {turn['text']}" if stamp else str(turn["text"])
            out.append({"name": str(turn.get("event_id") or f"s{session['session_index']}"),
                        "body": f"{turn['speaker']}({ROLE_TYPE}): {content}",
                        "when": when, "speaker": str(turn["speaker"])})
    return out


def _group(unit: str) -> str:
    """graphiti's group ids are [A-Za-z0-9_-]+."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", unit) or "unit"


# --- one unit's graph ---------------------------------------------------------------------


class _Unit:
    """Graphiti over this unit's Kùzu file (build and search open it the same way)."""

    def __init__(self, req: dict[str, Any]) -> None:
        from openai import AsyncOpenAI

        g = _state["g"]
        settings = _state["settings"]
        store = Path(req["store_dir"])
        store.mkdir(parents=True, exist_ok=True)
        self.group = _group(str(req["unit"]))
        key = "structmem"  # the front needs none; the SDK wants one
        self.driver = g["KuzuDriver"](db=str(store / GRAPH_FILE))
        # add_episode(group_id=...) clones the driver unless the id is its database; Kùzu's
        # clone is itself, but the check reads `_database`, which its driver never sets.
        self.driver._database = self.group
        self._fulltext_indexes()
        cfg = g["LLMConfig"](api_key=key, model=req["model"], small_model=req["model"],
                             base_url=req["base_url"])
        self.clients = [AsyncOpenAI(api_key=key, base_url=req["base_url"]) for _ in range(3)]
        llm = g["LLM"](config=cfg, client=self.clients[0])
        embedder = g["Embedder"](
            config=g["EmbedderConfig"](api_key=key, base_url=req["base_url"],
                                       embedding_model=req["embed_model"],
                                       embedding_dim=int(req["embed_dims"])),
            client=self.clients[1])
        reranker = g["Reranker"](config=cfg, client=self.clients[2])
        self.graphiti = g["Graphiti"](graph_driver=self.driver, llm_client=llm,
                                      embedder=embedder, cross_encoder=reranker,
                                      max_coroutines=settings.get("max_coroutines"))

    def _fulltext_indexes(self) -> None:
        """graphiti's Kùzu driver builds no index (build_indices_and_constraints is a no-op)
        and its searches query these full-text indexes: make them (once per file)."""
        import kuzu

        g = _state["g"]
        conn = kuzu.Connection(self.driver.db)
        try:
            have = {str(r[1]) for r in _rows(conn.execute("CALL SHOW_INDEXES() RETURN *"))}
            for query in g["fts"](g["GraphProvider"].KUZU):
                name = re.search(r"'(\w+)',\s*\[", query)
                if name and name.group(1) in have:
                    continue
                conn.execute(query)
        finally:
            conn.close()

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        self.driver.client.close()  # graphiti's close() leaves Kùzu's file open
        self.driver.db.close()


async def _all(cls: Any, u: _Unit) -> list[Any]:
    """Every entity node or fact of the unit's group (graphiti raises when there is none)."""
    from graphiti_core.errors import GroupsEdgesNotFoundError, GroupsNodesNotFoundError

    try:
        return list(await cls.get_by_group_ids(u.driver, [u.group]))
    except (GroupsEdgesNotFoundError, GroupsNodesNotFoundError):
        return []


def _rows(result: Any) -> list[list[Any]]:
    rows = []
    while result.has_next():
        rows.append(result.get_next())
    return rows


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, dt.datetime) else (str(value) if value else None)


def _fact(edge: Any, names: dict[str, str]) -> dict[str, Any]:
    when = edge.valid_at or getattr(edge, "reference_time", None)
    return {"memory_id": str(edge.uuid), "owner": None, "kind": "memory", "text": str(edge.fact),
            "created_at": _iso(when),
            "metadata": {"kind": "memory", "relation": edge.name, "valid_at": _iso(edge.valid_at),
                         "invalid_at": _iso(edge.invalid_at), "expired_at": _iso(edge.expired_at),
                         "reference_time": _iso(getattr(edge, "reference_time", None)),
                         "source": names.get(edge.source_node_uuid),
                         "target": names.get(edge.target_node_uuid),
                         "episodes": len(edge.episodes or [])}}


def _entity(node: Any) -> dict[str, Any]:
    return {"memory_id": str(node.uuid), "owner": None, "kind": "entity",
            "text": f"{node.name}: {node.summary}" if node.summary else str(node.name),
            "created_at": None,  # graphiti stamps nodes with the (frozen) clock, not a date
            "metadata": {"kind": "entity", "name": node.name, "labels": list(node.labels or [])}}


async def _build_async(req: dict[str, Any]) -> dict[str, Any]:
    g = _state["g"]
    unit = str(req["unit"])
    store = Path(req["store_dir"])
    for old in (GRAPH_FILE, GRAPH_FILE + ".wal", GRAPH_FILE + ".lock"):  # a rebuild starts empty
        p = store / old
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    _state["drops"].take()
    drops: list[dict[str, str]] = []
    u = _Unit(req)
    try:
        episodes = _episodes(req)
        fallback = dt.datetime.now(dt.UTC)  # the frozen clock: an undated session
        for i, ep in enumerate(episodes):
            try:
                await u.graphiti.add_episode(
                    name=ep["name"], episode_body=ep["body"], source_description="",
                    reference_time=ep["when"] or fallback, source=g["EpisodeType"].message,
                    group_id=u.group)
            except Exception as e:
                import openai

                if isinstance(e, openai.APIError) and not isinstance(e, openai.APIResponseValidationError):
                    raise  # the front or the model server failed: the unit fails
                log.warning("episode %d/%d (%s) lost: %s: %s", i + 1, len(episodes),
                            ep["name"], type(e).__name__, str(e)[:300])
                drops.append({"where": "episode", "why": type(e).__name__})
        drops += _state["drops"].take()
        nodes = await _all(g["EntityNode"], u)
        edges = await _all(g["EntityEdge"], u)
        names = {n.uuid: n.name for n in nodes}
        memories = [_fact(e, names) for e in edges] + [_entity(n) for n in nodes]
    finally:
        await u.close()
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "episodes": len(episodes)}


async def _search_async(req: dict[str, Any]) -> dict[str, Any]:
    g = _state["g"]
    unit = str(req["unit"])
    k = int(req.get("k") or _state["settings"].get("top_k", 10))
    recipes = g["recipes"]
    # the harness: edges reranked by the cross-encoder, nodes by RRF, `k` of each
    config = g["SearchConfig"](
        edge_config=recipes.EDGE_HYBRID_SEARCH_CROSS_ENCODER.edge_config.model_copy(deep=True),
        node_config=recipes.NODE_HYBRID_SEARCH_RRF.node_config.model_copy(deep=True),
        limit=k)
    results: dict[str, list[dict[str, Any]]] = {}
    u = _Unit(req)
    try:
        names = {n.uuid: n.name for n in await _all(g["EntityNode"], u)}
        for q in req["questions"]:
            found = await u.graphiti.search_(str(q["question"]), config=config,
                                             group_ids=[u.group])
            hits = []
            for i, edge in enumerate(found.edges):
                hit = _fact(edge, names)
                hit["score"] = _score(found.edge_reranker_scores, i)
                hits.append(hit)
            for i, node in enumerate(found.nodes):
                hit = _entity(node)
                hit["score"] = _score(found.node_reranker_scores, i)
                hits.append(hit)
            results[str(q["question_id"])] = hits
    finally:
        await u.close()
    return {"op": "found", "unit": unit, "results": results, "calls": 0}


def _score(scores: list[float], i: int) -> float | None:
    return float(scores[i]) if i < len(scores) else None


def _build(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"build:{req['unit']}")
    return asyncio.run(_build_async(req))


def _search(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"search:{req['unit']}")
    return asyncio.run(_search_async(req))


def _version() -> str:
    return wc.package_version("graphiti-core")


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, _version())
