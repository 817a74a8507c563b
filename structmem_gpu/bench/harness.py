"""Plumbing shared by the bench parts: composed configs, pipeline runs, the server, injections.

    settings = BenchSettings(conf_dir=Path("conf"), out_dir=Path("outputs/bench/x"),
                             profile_overrides=("debug=ci",), base_url="http://127.0.0.1:8080/v1")
    cfg = settings.compose(["benchmark=sample"], cache_off=True, cache_dir=Path("/tmp/c"))
    wall = run_pipeline(cfg, run_dir)

Two injections exist only for the harness and swap a factory for the duration of one run:
`reference_schedule()` (every LLM batch goes out one request at a time, in the reference
code's order: the project's one deliberate per-request loop) and `hashing_encoder()` (a
feature-hashing stand-in for the sentence encoder, so the 1,000-conversation scale point fits
the time limit on a CPU). Neither is reachable from conf/ or jobs/run.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from structmem_gpu.config.job import JobConfig

log = logging.getLogger(__name__)


@dataclass
class BenchSettings:
    conf_dir: Path  # the repository's conf/ (absolute)
    out_dir: Path  # the bench directory (bench.json, bench.md, runs/, data/)
    profile_overrides: tuple[str, ...] = ()  # e.g. ("debug=ci",) for the CPU profile
    user_overrides: tuple[str, ...] = ()  # Hydra overrides from the command line
    tiny: bool = False  # CI smoke sizes
    base_url: str | None = None  # the LLM endpoint every pipeline run attaches to
    notes: list[str] = field(default_factory=list)

    def overrides_for(
        self,
        extra: Sequence[str] = (),
        *,
        cache_off: bool = False,
        cache_dir: Path | None = None,
        scripted: bool = False,
    ) -> list[str]:
        """Profile, user, `extra`, then the harness's own overrides (later ones win).
        `scripted`: the scripted LLM instead of the configured one (user llm.* dropped)."""
        user = (
            [o for o in self.user_overrides if not _is_llm_override(o)]
            if scripted
            else list(self.user_overrides)
        )
        forced = (
            ["llm=scripted"] if scripted else ["++llm.progress=false"]
        )  # ++: scripted has no key
        if self.base_url and not scripted:
            forced.append(f"llm.base_url={self.base_url}")
        if cache_off:
            forced.append("cache.llm=false")
        if cache_dir is not None:
            forced.append(f"paths.cache_dir={cache_dir}")
        return [*self.profile_overrides, *user, *extra, *forced]

    def compose(
        self,
        extra: Sequence[str] = (),
        *,
        cache_off: bool = False,
        cache_dir: Path | None = None,
        scripted: bool = False,
    ) -> JobConfig:
        return compose(
            self.conf_dir,
            self.overrides_for(extra, cache_off=cache_off, cache_dir=cache_dir, scripted=scripted),
        )

    def path(self, *parts: str) -> Path:
        """A file path under the bench directory (its folder created)."""
        p = self.out_dir.joinpath(*parts)
        p.parent.mkdir(parents=True, exist_ok=True)
        return p


def _is_llm_override(o: str) -> bool:
    key = o.lstrip("+~").split("=", 1)[0]
    return key == "llm" or key.startswith("llm.") or key.startswith("llm@")


def compose(conf_dir: Path, overrides: Sequence[str]) -> JobConfig:
    """conf/config.yaml with overrides, composed in-process (the same config jobs/run.py gets)
    and checked into the typed JobConfig every bench part reads."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir.resolve()), version_base="1.3"):
        return JobConfig.from_cfg(hydra_compose(config_name="config", overrides=list(overrides)))


def run_pipeline(
    job: JobConfig, run_dir: Path, registry: Mapping[str, Any] | None = None
) -> float:
    """Run the configured stages into `run_dir` (forced: a bench always measures); wall seconds."""
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import run_stages

    job = job.with_values(force=True)  # force never changes a fingerprint
    t0 = time.perf_counter()
    run_stages(
        job, run_dir, registry if registry is not None else stage_registry(job)
    )
    return time.perf_counter() - t0


def llm_stages(job: JobConfig, stages: Sequence[str]) -> list[str]:
    """The stages among `stages` that may send LLM requests, as each Stage declares it
    (`uses` names "llm" or "judges"; stage.py), in the given order."""
    from structmem_gpu.methods.registry import stage_registry

    registry = stage_registry(job)
    return [s for s in stages if registry[s].sends_llm_requests]


def manifest_stages(run_dir: Path) -> dict[str, dict[str, Any]]:
    """stage -> {build_cost..., notes} from a run's manifest.json."""
    data = json.loads((run_dir / "manifest.json").read_text())
    return {
        name: {**e.get("build_cost", {}), "notes": e.get("notes", {})}
        for name, e in data.get("stages", {}).items()
    }


@contextlib.contextmanager
def llm_endpoint(job: JobConfig, log_dir: Path) -> Iterator[tuple[str | None, Any]]:
    """(base_url, backend) of the configured LLM: attached, launched once for the whole bench
    (stopped on exit), or (None, None) for backends without an HTTP endpoint (scripted,
    vllm_offline), which each pipeline run then opens itself."""
    from structmem_gpu.llm.factory import open_llm

    from structmem_gpu.llm.backends import backend

    llm = job.root.llm
    if not backend(llm.backend).http:
        yield None, None
        return
    with open_llm(
        llm.model_copy(update={"progress": False}), log_dir=log_dir, cache_dir=None, name="bench"
    ) as backend:
        server = getattr(backend, "server", None)
        url = server.base_url if server is not None else str(llm.base_url)
        yield url, backend


# ---- the reference schedule --------------------------------------------------------------


def reference_order(requests: Sequence[Any]) -> list[int]:
    """Indices in the order the reference code sends them: conversation by conversation (first
    appearance), and inside a conversation the perspectives of one window back to back
    (factual, relational, next window...) rather than grouped by prompt as our batch is."""
    conv_first: dict[Any, int] = {}
    rank: dict[int, int] = {}
    seen: dict[tuple[Any, str], int] = {}
    version_pos: dict[str, int] = {}
    for i, r in enumerate(requests):
        conv_first.setdefault(r.conv_id, len(conv_first))
        version_pos.setdefault(r.prompt_version, len(version_pos))
        key = (r.conv_id, r.prompt_version)
        rank[i] = seen.get(key, 0)
        seen[key] = rank[i] + 1
    return sorted(
        range(len(requests)),
        key=lambda i: (
            conv_first[requests[i].conv_id],
            rank[i],
            version_pos[requests[i].prompt_version],
            i,
        ),
    )


class ReferenceScheduleBackend:
    """Wraps a backend so that a batch goes out one request at a time, in reference order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.requests_sent = 0

    def generate(
        self, requests: Sequence[Any], *, desc: str = "", on_result: Any = None
    ) -> list[Any]:
        results: list[Any] = [None] * len(requests)
        # The one deliberate per-request loop of the project (docs/design.md "Principles", 1):
        # it measures what batching buys by doing what the reference code does.
        for i in reference_order(requests):
            [res] = self.inner.generate([requests[i]], desc=desc)
            self.requests_sent += 1
            results[i] = res
            if on_result is not None:
                on_result(i, res)
        return results


@contextlib.contextmanager
def reference_schedule() -> Iterator[None]:
    """Within the block, every backend the pipeline opens follows the reference schedule."""
    from structmem_gpu.llm import factory

    real_open = factory.open_llm

    @contextlib.contextmanager
    def open_sequential(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with real_open(*args, **kwargs) as backend:
            yield ReferenceScheduleBackend(backend)

    with mock.patch.object(factory, "open_llm", open_sequential):
        yield


# ---- the hashing encoder -----------------------------------------------------------------


class HashingModel:
    """Feature hashing of lower-cased words into `dim` signed buckets: deterministic, no model,
    ~100x faster than MiniLM on a CPU. Only for scale measurements; its vectors mean little."""

    # CPU seconds spent in encode() by every instance of this process: the stand-in's Python
    # loop costs ~0.3 ms a window text, work a GPU encoder does on the GPU, so the paced bench
    # reports it apart from the framework's CPU (bench/paced.py)
    cpu_s: float = 0.0

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, inputs: list[str], **_: Any) -> np.ndarray:
        c0 = time.process_time()
        out = np.zeros((len(inputs), self.dim), dtype=np.float32)
        for i, text in enumerate(inputs):
            for word in text.lower().split():
                h = zlib.crc32(word.encode())
                out[i, h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
        HashingModel.cpu_s += time.process_time() - c0
        return out


@contextlib.contextmanager
def hashing_encoder(dim: int = 384) -> Iterator[None]:
    """Within the block, the pipeline's encoder is the hashing stand-in (no cache)."""
    from structmem_gpu.embed import encoder as enc_mod

    def open_hashing(cfg: Mapping[str, Any], *, cache_dir: Path | None) -> Any:
        return enc_mod.Encoder(HashingModel(dim), f"hashing-{dim}@bench", cache=None)

    with mock.patch.object(enc_mod, "open_encoder", open_hashing):
        yield


def timed_import_encoder_stack() -> float:
    """Import torch + sentence-transformers now (seconds): a one-time process cost that would
    otherwise land in the first encoder stage's wall time as framework overhead."""
    t0 = time.perf_counter()
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401

    return round(time.perf_counter() - t0, 3)
