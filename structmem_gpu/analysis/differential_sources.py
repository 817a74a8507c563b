"""What each recorded request of a run sent, read back from the response caches (for
analysis/differential.py).

A run's requests.parquet holds one row per request and only a hash of what was sent; the
contents live in the response caches under `paths.cache_dir/llm`:

- our stages' rows: `ResponseCache.row_for(messages_hash)` (llm_responses.seg): the messages,
  the model, the sampling parameters and the JSON schema;
- a foreign system's rows (prompt_version "<system>/chat" or "<system>/embeddings", written by
  the recording front, systems/front.py): `FrontCache.body_for(messages_hash)`
  (system_responses.seg): the chat body as the system sent it (embedding bodies are not kept by
  the front today, so their inputs are compared only where a body is found).

The stage of a system row is the phase of its request_id ("<stage>:<system>:<phase>:<unit>:
<seq>"): official pipelines' workers name sub-phases "build.extract", "search.retrieve", ...,
whose part after the dot is the stage; a plain "build" / "search" stays as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import InputError
from structmem_gpu.llm.cache import CACHE_FILE, ResponseCache
from structmem_gpu.systems.front import CACHE_DIRNAME, FrontCache

SYSTEM_KINDS = ("/chat", "/embeddings")  # prompt_version suffixes of the front's rows
REQUESTS_TABLE = Path("tables") / "requests.parquet"


@dataclass(frozen=True)
class Recorded:
    """One recorded request with what it sent (None where the cache does not hold it)."""

    request_id: str
    stage: str
    conv_id: str | None
    messages_hash: str
    embedding: bool
    canon: str | None  # the canonical form compared for identity (see differential.py)
    text: str | None  # the messages rendered one block per message, for similarity and diffs
    params: str  # model, sampling and output-format settings, "k=v" sorted; not in `canon`


def is_system(prompt_version: str | None) -> bool:
    return bool(prompt_version) and str(prompt_version).endswith(SYSTEM_KINDS)


def stage_of(stage: str | None, request_id: str, prompt_version: str | None) -> str:
    """The stage a row is compared under: the requests' stage column for our stages, the
    request_id's phase (after its dot, if any) for a system's rows."""
    if is_system(prompt_version):
        parts = str(request_id).split(":", 3)  # the unit (conv id) may hold ':'; the phase not
        if len(parts) == 4 and parts[2]:
            return parts[2].split(".", 1)[-1]
    return str(stage)


def _content(value: Any) -> str:
    """A message's content as one string: a string as is, none as "", anything else (a list
    of content parts) as sorted-key JSON, so it never equals a plain string by accident."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def canonical(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(canonical JSON of [{role, content}] in order, the rendered text)."""
    pairs = [{"role": str(m.get("role")), "content": _content(m.get("content"))} for m in messages]
    canon = json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))
    return canon, "\n".join(f"[{p['role']}]\n{p['content']}" for p in pairs)


def _value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # temperature 0 and 0.0 are one setting
    return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def params_text(model: str | None, settings: dict[str, Any]) -> str:
    items = {"model": model, **settings}
    return " ".join(f"{k}={v if isinstance(v, str) else _value(v)}"
                    for k, v in sorted(items.items()) if v is not None)


def _body_settings(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body's settings beside its messages, named as ours are (response_format by its
    type, tools by their count, message fields other than role/content by their names)."""
    out: dict[str, Any] = {}
    for k, v in body.items():
        if k in ("messages", "model", "stream", "user"):
            continue
        if k == "response_format" and isinstance(v, dict):
            strict = v.get("type") == "json_schema" and (v.get("json_schema") or {}).get("strict")
            out[k] = str(v.get("type")) + (":strict" if strict else "")
        elif k == "tools" and isinstance(v, list):
            out[k] = len(v)
        else:
            out[k] = v
    messages = body.get("messages") or []
    extra = sorted({f for m in messages for f in m if f not in ("role", "content")})
    if extra:
        out["message_fields"] = ",".join(extra)
    return out


def _row_settings(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(json.loads(row["sampling"])) if row.get("sampling") else {}
    if row.get("schema"):
        out["response_format"] = "json_schema"
    return out


class Stores:
    """The two caches of one cache dir, opened on first need; a missing store is an error
    naming it (a run made with cache.llm=false, or the wrong --cache-dir)."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)
        self._llm: ResponseCache | None = None
        self._front: FrontCache | None = None

    def _need(self, path: Path, what: str) -> None:
        if not path.is_dir():
            raise InputError(path, f"no {what} here, so the run's requests cannot be read back "
                                   f"(pass the cache the runs used: --cache-dir DIR, the "
                                   f"runs' paths.cache_dir)")

    @property
    def llm(self) -> ResponseCache:
        if self._llm is None:
            self._need(self.cache_dir / "llm" / CACHE_FILE, "response cache")
            self._llm = ResponseCache(self.cache_dir / "llm")
        return self._llm

    @property
    def front(self) -> FrontCache:
        if self._front is None:
            path = self.cache_dir / "llm" / CACHE_DIRNAME
            self._need(path, "recording front's cache")
            self._front = FrontCache(path)
        return self._front

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()


def _resolve(stores: Stores, system: bool, mhash: str, embedding: bool
             ) -> tuple[str | None, str | None, dict[str, Any]]:
    """(canon, text, settings) of one hash; canon None when the cache does not hold it."""
    if system:
        body = stores.front.body_for(mhash)
        if body is None:
            return None, None, {}
        if embedding:
            inputs = body.get("input")
            inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
            return json.dumps(inputs, ensure_ascii=False), "\n".join(map(str, inputs)), {}
        canon, text = canonical(list(body.get("messages") or []))
        return canon, text, _body_settings(body)
    row = stores.llm.row_for(mhash)
    if row is None:
        return None, None, {}
    canon, text = canonical(json.loads(row["messages"]))
    return canon, text, _row_settings(row)


def _unseeded_stages(run_root: Path) -> tuple[bool, bool]:
    """(the job's llm, its judge's llm) sent no seed (`request_seed: false` in the saved
    config): the cache stores a request's sampling seed either way, the wire body lacked it."""
    from structmem_gpu.config.run_changes import previous_config

    saved = previous_config(Path(run_root)) or {}
    llm = saved.get("llm") or {}
    judge = (saved.get("judge") or {}).get("llm") or {}
    return llm.get("request_seed") is False, judge.get("request_seed") is False


def read_requests(run_root: Path, stores: Stores) -> list[Recorded]:
    """Every row of the run's requests.parquet in recorded order, its contents resolved."""
    import polars as pl

    path = Path(run_root) / REQUESTS_TABLE
    if not path.is_file():
        raise InputError(path, "missing: not a run directory with recorded requests (the "
                               "differential reads each run's requests.parquet)")
    try:
        df = pl.read_parquet(path, glob=False, columns=[
            "request_id", "stage", "conv_id", "model", "prompt_version", "messages_hash"])
    except Exception as e:  # a damaged or foreign file: one line naming it
        raise InputError(path, f"unreadable ({str(e).splitlines()[0]})") from e
    seen: dict[tuple[bool, str], tuple[str | None, str | None, dict[str, Any]]] = {}
    unseeded, judge_unseeded = _unseeded_stages(run_root)
    out = []
    for r in df.iter_rows(named=True):
        system = is_system(r["prompt_version"])
        embedding = system and str(r["prompt_version"]).endswith("/embeddings")
        mhash = str(r["messages_hash"] or "")
        if (system, mhash) not in seen:  # cache hits repeat a hash: one lookup each
            seen[system, mhash] = (_resolve(stores, system, mhash, embedding) if mhash
                                   else (None, None, {}))
        canon, text, settings = seen[system, mhash]
        stage = stage_of(r["stage"], r["request_id"], r["prompt_version"])
        if not system and (judge_unseeded if str(r["stage"]).startswith("judge") else unseeded):
            settings = {k: v for k, v in settings.items() if k != "seed"}
        out.append(Recorded(str(r["request_id"]), stage, r["conv_id"], mhash, embedding, canon,
                            text, params_text(r["model"], settings)))
    return out


def cache_dir_of(run_root: Path) -> Path:
    """The run's paths.cache_dir as its saved config (.hydra/config.yaml) gives it, resolved
    here (a relative one against the working directory, as the job that ran did)."""
    from structmem_gpu.analysis.run import Run

    saved = Path(run_root) / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise InputError(saved, "missing, so paths.cache_dir is unknown: pass --cache-dir DIR")
    try:
        value = Run(run_root).config_value("paths.cache_dir")
    except Exception as e:  # an interpolation only the launching job resolves
        raise InputError(saved, f"paths.cache_dir does not resolve here ({e}): "
                                "pass --cache-dir DIR") from e
    if not value:
        raise InputError(saved, "paths.cache_dir is not set: pass --cache-dir DIR")
    return Path(str(value))
