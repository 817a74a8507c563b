"""The bench suite: run the selected parts against one LLM endpoint, write bench.json + bench.md.

    python jobs/bench.py                                  # all parts, CPU profile
    python jobs/bench.py --tiny llm.base_url=URL          # CI smoke sizes (keys, never timings)

Sizes per profile (SIZES): `cpu` keeps the whole suite under 15 minutes on 2 cores (sample
conversations, debug=ci reply caps, hashing encoder for the 1,000-conversation scale point);
`gpu` measures LoCoMo-sized components. A part that fails records {"error": ...} and the
suite goes on; the CLI exits non-zero when any part failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from structmem_gpu.bench.harness import BenchSettings, llm_endpoint, timed_import_encoder_stack
from structmem_gpu.bench.report import render_markdown
from structmem_gpu.bench.synthetic import SyntheticSpec, write_locomo

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Part:
    """One bench part: the Suite method that runs it and when it runs."""

    method: str  # the Suite method (its result is bench.json's entry for the part)
    default: bool = True  # runs when no part is named
    llm: bool = True  # talks to the configured LLM (when no part does, no server is launched)


# The bench's parts, in execution order: the cheap LLM-free parts first (a broken environment
# fails fast), the longest (schedule: every build request again, one at a time) last. `paced`
# (minutes of simulated GPU builds) and `lme-groups` (scripted LongMemEval-M-shaped builds,
# ~10 min at 200 questions) run only when named. bench/report.py SECTIONS renders each.
PART_SPECS: dict[str, Part] = {
    "components": Part("part_components", llm=False),
    "dry-run": Part("part_dry_run", llm=False),
    "lme-count": Part("part_lme_count", llm=False),
    "lme-load": Part("part_lme_load", llm=False),
    "client": Part("part_client", llm=False),
    "llm": Part("part_llm"),
    "build": Part("part_build"),
    "cost": Part("part_cost", llm=False),
    "scale": Part("part_scale"),
    "schedule": Part("part_schedule"),
    "paced": Part("part_paced", default=False, llm=False),
    "lme-groups": Part("part_lme_groups", default=False, llm=False),
}
PARTS = tuple(PART_SPECS)
DEFAULT_PARTS = tuple(n for n, p in PART_SPECS.items() if p.default)
NO_LLM_PARTS = frozenset(n for n, p in PART_SPECS.items() if not p.llm)

SIZES: dict[str, dict[str, Any]] = {
    "cpu": {
        "llm_requests": 3,
        "llm_max_tokens": 64,
        "llm_rounds": 2,
        "texts": 512,
        "faiss": (10, 1200, 154),
        "parquet": 200_000,
        "sizes": (10, 100, 1000),
        "real_sizes": (1, 2),
        "haystack": SyntheticSpec(50, 4, 6, 1, shared_pool=40),
        "spec": SyntheticSpec(1, 4, 6, 2),
        "encoder": "hashing",
        "timeout_s": 600,
        "schedule_slice": None,
        "client_in_flight": (1, 8, 64, 256, 1024),
        "client_requests": 2000,
        "client_rounds": 2,
        # lme-load: (questions, sessions per haystack, pool): LongMemEval-M's shape
        "lme_load": ((100, 500, 20_000),),
    },
    "gpu": {
        "llm_requests": 256,
        "llm_max_tokens": 256,
        "llm_rounds": 2,
        "texts": 20_000,
        "faiss": (100, 5000, 154),
        "parquet": 2_000_000,
        "sizes": (10, 100, 1000),
        "real_sizes": (10, 100),
        "haystack": SyntheticSpec(500, 8, 12, 1, shared_pool=300),
        "spec": SyntheticSpec(1, 8, 12, 2),
        "encoder": "configured",
        "timeout_s": 3600,
        "schedule_slice": (2, 6),
        "client_in_flight": (1, 8, 64, 256, 1024),
        "client_requests": 4000,
        "client_rounds": 2,
        "lme_load": ((100, 500, 20_000), (500, 500, 20_000)),
    },
    "tiny": {
        "llm_requests": 2,
        "llm_max_tokens": 16,
        "llm_rounds": 1,
        "texts": 64,
        "faiss": (2, 200, 8),
        "parquet": 2000,
        "sizes": (2, 4),
        "real_sizes": (),
        "haystack": SyntheticSpec(4, 2, 3, 1, shared_pool=3),
        "spec": SyntheticSpec(1, 2, 3, 1),
        "encoder": "hashing",
        "timeout_s": 300,
        "schedule_slice": None,
        "client_in_flight": (1, 8),
        "client_requests": 40,
        "client_rounds": 1,
        "lme_load": ((4, 10, 20),),
    },
}
PROFILE_OVERRIDES = {"cpu": ("debug=ci",), "gpu": ()}


@dataclass
class SuiteOptions:
    parts: tuple[str, ...] = DEFAULT_PARTS
    profile: str = "cpu"
    tiny: bool = False
    cost_run_dir: Path | None = None  # `cost` source; default: this suite's build run
    locomo_path: Path | None = None  # full-LoCoMo dry-run estimate when given
    sizes: tuple[int, ...] | None = None  # scale sizes (None = profile default)
    scale_encoder: str | None = None  # hashing | configured (None = profile default)
    # schedule on (first N conversations, first M sessions); None = profile default; (0, 0) =
    # the build's data
    schedule_slice: tuple[int, int] | None = None
    lme_questions: tuple[int, ...] | None = None  # lme-load question counts (None = profile's)
    # lme-groups: question counts of the scripted grouped builds, and question_groups
    lme_group_questions: tuple[int, ...] = (50, 100, 200)
    lme_group: int = 25
    # lme-load: the generator's date shapes (longmemeval_synthetic.py DATES)
    lme_dates: tuple[str, ...] = ("per_haystack",)
    # lme-count: a real LongMemEval file (None = benchmark=longmemeval's path, when it exists)
    lme_file: Path | None = None
    size: dict[str, Any] = field(default_factory=dict)
    # `paced`: synthetic sizes, builds and the mock's time scale (bench/paced.py)
    paced_sizes: tuple[str, ...] = ("locomo", "longmemeval_s")
    paced_builds: tuple[str, ...] = ("structmem", "seem")
    paced_time_scale: float = 10.0
    paced_prefix_caching: bool = True  # the mock models vLLM's automatic prefix caching
    # the engine the mock plays (bench/paced_model.py ENGINES): bf16, or fp8 (the opt-in FP8
    # preset's deviation, its speed-up taken from the vLLM docs' published figure)
    paced_engine: str = "bf16"

    def __post_init__(self) -> None:
        self.size = dict(SIZES["tiny" if self.tiny else self.profile])
        if self.lme_questions:
            self.size["lme_load"] = tuple((q, 500, 20_000) for q in self.lme_questions)
        if self.sizes:
            self.size["sizes"] = self.sizes
        if self.scale_encoder:
            self.size["encoder"] = self.scale_encoder
        if self.schedule_slice is not None:
            self.size["schedule_slice"] = self.schedule_slice if any(self.schedule_slice) else None


def tiny_dataset(settings: BenchSettings) -> list[str]:
    """1 conversation, 1 session of 3 turns, factual perspective only: 1 extract + 1 consolidate
    request per build, so the CI schedule comparison costs 4 uncached requests."""
    path = write_locomo(SyntheticSpec(1, 1, 3, 1), settings.path("data", "tiny.json"))
    return [
        "benchmark=locomo",
        f"benchmark.path={path}",
        "benchmark.conversations=null",
        "benchmark.max_sessions=null",
        "extract.perspectives=[fact]",
    ]


def _other_llm_servers() -> int:
    """llama.cpp / vLLM servers on this machine not started by this process (contention)."""
    me, n = os.getpid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        try:
            cmd = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
        servers = ("llama_cpp.server", "vllm serve", "vllm.entrypoints.openai.api_server")
        if any(s in cmd for s in servers) and ppid != me:
            n += 1
    return n


def _meta(settings: BenchSettings, opts: SuiteOptions) -> dict[str, Any]:
    from structmem_gpu.core.artifacts import git_commit

    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "profile": opts.profile,
        "tiny": opts.tiny,
        "parts": list(opts.parts),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "git_commit": git_commit(settings.conf_dir.parent),
        "overrides": [*settings.profile_overrides, *settings.user_overrides],
        "loadavg_start": round(os.getloadavg()[0], 2),
        "other_llm_servers": _other_llm_servers(),
    }


class Suite:
    """One bench run: the parts share the LLM endpoint, the build run and bench.json."""

    def __init__(self, settings: BenchSettings, opts: SuiteOptions) -> None:
        self.settings, self.opts, self.sz = settings, opts, opts.size
        self.t0 = time.perf_counter()
        self.bench: dict[str, Any] = {"meta": _meta(settings, opts)}
        self.dataset = tiny_dataset(settings) if opts.tiny else []
        self.base = settings.compose(self.dataset)
        self.build_run: Path | None = None  # the build (or batched schedule) run directory

    def run(self) -> dict[str, Any]:
        """Run the parts in PARTS order; write bench.json and bench.md after each part."""
        parts: dict[str, Callable[[], Any]] = {
            name: getattr(self, spec.method) for name, spec in PART_SPECS.items()}
        meta = self.bench["meta"]
        if {"build", "schedule", "components"} & set(self.opts.parts):
            # Imported up front: a one-time process cost that would otherwise land in the first
            # encoder stage as framework overhead (and in only one leg of the schedule).
            meta["encoder_import_s"] = timed_import_encoder_stack()
        needs_llm = not set(self.opts.parts) <= NO_LLM_PARTS
        endpoint = (
            llm_endpoint(self.base, self.settings.out_dir / "logs")
            if needs_llm
            else contextlib.nullcontext((None, None))
        )
        with endpoint as (url, _backend):
            self.settings.base_url = url
            llm = self.base.root.llm
            where = url or ("in-process" if needs_llm else "not started (no part needs it)")
            meta["llm"] = f"{llm.backend} {llm.served_name} at {where}"
            for name in (p for p in PARTS if p in self.opts.parts):
                log.info("bench part %s", name)
                p0 = time.perf_counter()
                try:
                    self.bench[name.replace("-", "_")] = parts[name]()
                except Exception as e:  # noqa: BLE001 - a failed part is recorded; the rest run
                    log.exception("bench part %s failed", name)
                    self.bench[name.replace("-", "_")] = {"error": f"{type(e).__name__}: {e}"}
                meta.setdefault("part_wall_s", {})[name] = round(time.perf_counter() - p0, 3)
                write_outputs(self.settings.out_dir, self.bench, self.t0)
        meta["notes"] = self.settings.notes
        write_outputs(self.settings.out_dir, self.bench, self.t0)
        return self.bench

    def part_client(self) -> list[dict[str, Any]]:
        from structmem_gpu.bench import client_bench

        # Requests of the configured benchmark, whatever llm is configured (the mock answers).
        return client_bench.run_client_bench(
            self.settings.compose(),
            self.settings.out_dir / "logs",
            in_flight=self.sz["client_in_flight"],
            min_requests=self.sz["client_requests"],
            rounds=self.sz["client_rounds"],
        )

    def part_paced(self) -> dict[str, Any]:
        from structmem_gpu.bench import paced

        return paced.run_paced(self.settings, sizes=self.opts.paced_sizes,
                               methods=self.opts.paced_builds,
                               time_scale=self.opts.paced_time_scale,
                               prefix_caching=self.opts.paced_prefix_caching,
                               engine=self.opts.paced_engine)

    def part_llm(self) -> dict[str, Any]:
        from structmem_gpu.bench import llm_bench

        if not self.settings.base_url:
            return {"skipped": f"llm.backend={self.base.root.llm.backend} has no HTTP endpoint"}
        cfg = self.settings.compose()  # requests of the configured benchmark (default: sample)
        return llm_bench.run_llm_bench(
            cfg,
            self.settings.base_url,
            n=self.sz["llm_requests"],
            max_tokens=self.sz["llm_max_tokens"],
            log_dir=self.settings.out_dir / "logs",
            rounds=self.sz["llm_rounds"],
        )

    def part_build(self) -> dict[str, Any]:
        from structmem_gpu.bench import build

        stages = list(build.schedule_stages()) if self.opts.tiny else None
        out = build.run_build(self.settings, self.dataset, stages)
        out["encoder_import_s"] = self.bench["meta"].get("encoder_import_s")
        self.build_run = Path(out["run_dir"])
        return out

    def part_schedule(self) -> dict[str, Any]:
        from structmem_gpu.bench import build

        if self.sz["schedule_slice"]:
            cut = build.slice_overrides(self.base, *self.sz["schedule_slice"])
            return build.run_schedule(self.settings, [*self.dataset, *cut])
        # Both legs are run here, back to back, rather than reusing the build run as the batched
        # leg: minutes apart, a shared machine's load can differ enough to flip the ratio.
        out = build.run_schedule(self.settings, self.dataset)
        self.build_run = self.build_run or Path(out["batched"]["run_dir"])  # for `cost`
        return out

    def part_components(self) -> dict[str, Any]:
        from structmem_gpu.bench import components

        from structmem_gpu.methods.structmem.retrieve import RetrieveSettings

        job = self.base
        emb = job.root.embedder
        convs, per_conv, queries = self.sz["faiss"]
        k = job.settings(RetrieveSettings).entries_k if job.has("retrieve") else 60
        return components.run_components(
            emb,
            texts=self.sz["texts"],
            conversations=convs,
            per_conv=per_conv,
            queries_per_conv=queries,
            k=k,
            parquet_rows=self.sz["parquet"],
        )

    def part_cost(self) -> dict[str, Any]:
        from structmem_gpu.bench import cost

        src = self.opts.cost_run_dir or self.build_run
        if src is None:
            return {"skipped": "no run directory (run `build` in the same suite or pass --run-dir)"}
        return cost.cost_report(src)

    def part_scale(self) -> dict[str, Any]:
        from structmem_gpu.bench import scale

        sz = self.sz
        return scale.run_scale(
            self.settings,
            sizes=sz["sizes"],
            real_sizes=sz["real_sizes"],
            haystack=sz["haystack"],
            encoder=sz["encoder"],
            timeout_s=sz["timeout_s"],
            spec=sz["spec"],
        )

    def part_lme_load(self) -> dict[str, Any]:
        from structmem_gpu.bench import lme_load

        # Files are kept beside the bench directories: the 500-question one is 1.4 GB.
        data = self.settings.out_dir.parent / "data"
        return lme_load.run_lme_load(data, self.settings.out_dir / "lme_load", self.sz["lme_load"],
                                     dates=self.opts.lme_dates)

    def part_lme_groups(self) -> dict[str, Any]:
        from structmem_gpu.bench import lme_groups

        data = self.settings.out_dir.parent / "data"  # shared with lme-load
        return lme_groups.run_lme_groups(data, self.settings.out_dir / "lme_groups",
                                         self.opts.lme_group_questions, self.opts.lme_group)

    def part_lme_count(self) -> dict[str, Any]:
        """How much of a real LongMemEval file repeats (bench/lme_count.py), when one is here."""
        from structmem_gpu.bench.lme_count import count_file

        path = self.opts.lme_file
        if path is None:
            path = Path(str(self.settings.compose(["benchmark=longmemeval"]).root.benchmark.path))
        if not path.is_file():
            return {"rows": [{"file": str(path), "skipped": "no such file (pass --lme-file; "
                              "python jobs/data.py longmemeval_m downloads the real ones)"}]}
        return {"rows": [count_file(path)]}

    def part_dry_run(self) -> dict[str, Any]:
        from structmem_gpu.node import dry_run

        out: dict[str, Any] = {"build_config": dry_run.estimate(self.base)}
        if self.opts.tiny:
            out["locomo_full"] = "skipped (--tiny)"
        elif self.opts.locomo_path:
            full = _without_profile(self.settings, self.opts.locomo_path)
            out["locomo_full"] = dry_run.estimate(full)
        else:
            out["locomo_full"] = "skipped (no LoCoMo file: --locomo PATH or STRUCTMEM_LOCOMO_PATH)"
        return out


def run_suite(settings: BenchSettings, opts: SuiteOptions) -> dict[str, Any]:
    """Run the selected parts; returns bench.json's content (also written to settings.out_dir)."""
    return Suite(settings, opts).run()


def _without_profile(settings: BenchSettings, locomo: Path) -> Any:
    """Full-LoCoMo config as a real run would use it: user overrides, no debug=ci caps."""
    from structmem_gpu.bench.harness import compose

    return compose(
        settings.conf_dir,
        [
            *settings.user_overrides,
            "benchmark=locomo",
            f"benchmark.path={locomo}",
            "benchmark.conversations=null",
            "benchmark.max_sessions=null",
        ],
    )


def write_outputs(out_dir: Path, bench: dict[str, Any], t0: float) -> None:
    bench["meta"]["wall_s"] = round(time.perf_counter() - t0, 3)
    bench["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    bench["meta"]["loadavg_end"] = round(os.getloadavg()[0], 2)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench.json").write_text(json.dumps(bench, indent=1, default=str))
    (out_dir / "bench.md").write_text(render_markdown(bench))


def failed_parts(bench: dict[str, Any]) -> list[str]:
    return [k for k, v in bench.items() if k != "meta" and isinstance(v, dict) and "error" in v]
