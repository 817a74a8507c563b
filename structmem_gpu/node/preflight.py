"""Preflight: before any stage runs, check in seconds that the job can run on this node.

    found = preflight.check(job, stages, run_dir, overrides)     # list[Finding]
    preflight.enforce(found, dry_run=False)  # PreflightError (exit 2, one line) on a problem

What it checks (docs/replication.md "Replicate on a GPU node"), from the composed config and the roles the
job's stages use:

- every model the job loads (structmem_gpu/node/model_refs.py: answer LLM, judges and panel
  members, encoder, the window-packing tokenizer) is a local folder/file or complete in the
  Hugging Face cache; else, unless HF_HUB_OFFLINE is set, ONE probe of the hub with a short
  timeout (`preflight.hub_timeout_s`) says whether the job could download it. The tokenizer
  must be local in any case (packing loads it with local_files_only);
- the engine each launched LLM needs, as its backend checks it (llm/backends/,
  `Backend.engine_problem`): the `vllm` executable (or llm.server_python's vLLM) for
  vllm_server and vllm_cpu, an importable vllm for vllm_offline, llama_cpp.server for llamacpp;
- CUDA where the config asks for it (embedder.device=cuda..., index.use_gpu=true) and a
  FAISS with GPU support for index.use_gpu=true;
- free disk under the run directory and paths.cache_dir (`preflight.min_free_gb`).

Each problem is one line naming what is missing and the command or key that fixes it. A real
job stops with all of them in one error line (exit 2, no traceback; in a multirun the point
fails at once); `dry_run=true` prints them and still plans. Nothing is loaded: no model, no
torch unless CUDA is asked for, no faiss unless a GPU index is.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import PreflightSettings
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.llm.backends.spec import SETUP_GPU
from structmem_gpu.node.model_refs import (
    NOT_FOR_MODELS,
    ModelRef,
    NamedLLM,
    hub_offline,
    job_roles,
    locate,
    named_llms,
    named_models,
)

log = logging.getLogger(__name__)


class PreflightError(StructMemError):
    """The node cannot run the job as configured (models, engines, CUDA, disk)."""


@dataclass(frozen=True)
class Finding:
    """One thing the job needs and this node lacks. `fatal=False`: a note (printed, the job
    goes on); `blocks_dry_run`: refuses even a dry run (a GPU memory plan that cannot fit)."""

    problem: str
    fix: str = ""
    fatal: bool = True
    blocks_dry_run: bool = False
    subject: str = ""  # what lacks it (findings differing only here are reported together)

    def line(self) -> str:
        text = f"{self.subject}: {self.problem}" if self.subject else self.problem
        return f"{text}; fix: {self.fix}" if self.fix else text


def merged(found: Sequence[Finding]) -> list[Finding]:
    """Findings that differ only in their subject as one (two judges lacking vLLM: one line)."""
    groups: dict[tuple[str, str, bool, bool], list[str]] = {}
    for f in found:
        groups.setdefault((f.problem, f.fix, f.fatal, f.blocks_dry_run), []).append(f.subject)
    return [Finding(p, fix, fatal, blocks, ", ".join(s for s in subjects if s))
            for (p, fix, fatal, blocks), subjects in groups.items()]


@dataclass
class Job:
    """What every check reads: the job's typed configuration, its stages, where it writes, how
    it was called."""

    config: JobConfig
    stages: Sequence[Any]
    run_dir: Path
    overrides: Sequence[str] = ()
    _hub_down: list[str] = field(default_factory=list)  # set after the first failed probe

    @property
    def models_command(self) -> str:
        """The command that fetches this job's models ahead (same overrides as the job)."""
        kept = [o for o in self.overrides if not o.startswith(NOT_FOR_MODELS)]
        return " ".join(["python jobs/data.py models", *map(shlex.quote, kept)])


def _settings(job: Job) -> PreflightSettings | None:
    """preflight.* (None: the job has no preflight node; each check then uses its default)."""
    return job.config.root.preflight


# ---- models -------------------------------------------------------------------------------


def hub_probe(repo: str, revision: str | None, timeout_s: float) -> str:
    """'' when the hub says `repo` can be downloaded, else why not. One GET of the model's API
    page, bounded by `timeout_s` as a whole (name resolution included: it runs in a thread
    that is abandoned at the deadline), never huggingface_hub's retry ladder."""
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/models/{repo}" + (f"/revision/{revision}" if revision else "")
    result: list[str] = []

    def probe() -> None:
        import httpx
        from huggingface_hub import get_token

        token = get_token()
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            r = httpx.get(url, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            result.append(f"unreachable: {type(exc).__name__}")
            return
        if r.status_code in (401, 403, 404):
            result.append("not found on the hub (or private: log in with `hf auth login`)")
        elif r.status_code != 200:
            result.append(f"unreachable: HTTP {r.status_code}")
        elif (r.json() or {}).get("gated") and not token:
            result.append("gated on the hub: accept its licence and log in (`hf auth login`)")
        else:
            result.append("")

    worker = threading.Thread(target=probe, daemon=True, name="hub-probe")
    worker.start()
    worker.join(timeout_s + 0.5)
    return result[0] if result else f"unreachable: no answer within {timeout_s:g} s"


def _model_finding(job: Job, ref: ModelRef) -> Finding | None:
    where = locate(ref)
    if where.present:
        return None
    what = f"{ref.role} {ref.name} ({ref.key})"
    if ref.convert_from_gguf and where.status == "missing_path":
        return None  # the factory converts it on first use (llm/convert.py)
    if where.status == "missing_path":
        fix = (f"point {ref.key} at an existing file" if ref.gguf
               else f"point {ref.key} at a model folder, or a hub id and run {job.models_command}")
        return Finding(f"{where.path}: {where.detail}", fix, subject=what)
    fetch = f"{job.models_command} (on a node with network, e.g. the login node)"
    if ref.tokenizer_only:  # packing loads it with local_files_only: no download at run time
        return Finding(f"{where.detail}; packing needs it on disk", fetch, subject=what)
    if hub_offline():
        return Finding(f"{where.detail} and HF_HUB_OFFLINE is set", fetch, subject=what)
    if job._hub_down:
        return Finding(f"{where.detail}; the hub is {job._hub_down[0]}", fetch, subject=what)
    s = _settings(job)
    why = hub_probe(ref.name, ref.revision, 3.0 if s is None else s.hub_timeout_s)
    if why.startswith("unreachable"):
        job._hub_down.append(why)
    if why:
        return Finding(f"{where.detail}; the hub: {why}", fetch, subject=what)
    return Finding(f"{where.detail}; the job downloads it at load", fetch, fatal=False,
                   subject=what)


def check_models(job: Job) -> list[Finding]:
    found = [_model_finding(job, ref) for ref in named_models(job.config, job.stages)]
    return [f for f in found if f is not None]


# ---- engines ------------------------------------------------------------------------------


def _engine_finding(llm: NamedLLM) -> Finding | None:
    """What this machine lacks to launch `llm`, as its backend checks it (Backend.engine_problem)."""
    from structmem_gpu.llm.backends import backend

    c = llm.cfg
    found = backend(c.backend).engine_problem(c, llm.key)
    if found is None:
        return None
    return Finding(found.problem, found.fix, subject=f"{llm.role} ({llm.key}.backend={c.backend})")


def check_engines(job: Job) -> list[Finding]:
    found = [_engine_finding(llm) for llm in named_llms(job.config, job.stages) if llm.launched]
    return [f for f in found if f is not None]


# ---- CUDA, FAISS-GPU ----------------------------------------------------------------------


def check_gpu(job: Job) -> list[Finding]:
    """CUDA / FAISS-GPU where the config asks for them (the encoder role uses both)."""
    if "encoder" not in job_roles(job.stages):
        return []
    found = []
    root = job.config.root
    device = root.embedder.device or "auto"
    gpu_index = root.index.use_gpu is True
    if device.startswith("cuda") or gpu_index:
        import torch  # only here: CUDA was asked for

        if not torch.cuda.is_available():
            key = f"embedder.device={device}" if device.startswith("cuda") else "index.use_gpu=true"
            found.append(Finding(f"{key} but torch {torch.__version__} sees no CUDA device",
                                 f"run on a GPU node ({SETUP_GPU}), or embedder.device=auto "
                                 "index.use_gpu=auto"))
    if gpu_index:
        from structmem_gpu.index.faiss_index import gpu_available

        if not gpu_available():
            found.append(Finding(
                "index.use_gpu=true but the installed faiss has no GPU support or sees no GPU",
                f"{SETUP_GPU} (faiss-gpu), or index.use_gpu=auto"))
    return found


# ---- disk ---------------------------------------------------------------------------------


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(job: Job) -> list[Finding]:
    s = _settings(job)
    need_gb = 2.0 if s is None else float(s.min_free_gb)
    paths = job.config.root.paths
    cache_dir = Path(paths.cache_dir if paths is not None and paths.cache_dir else ".")
    places = {"run directory": job.run_dir, "paths.cache_dir": cache_dir}
    found = []
    for what, path in places.items():
        free_gb = shutil.disk_usage(_existing(path)).free / 1e9
        if free_gb < need_gb:
            found.append(Finding(f"{what} {path}: {free_gb:.1f} GB free, under "
                                 f"preflight.min_free_gb={need_gb:g}",
                                 "free space there, move it (paths.output_dir=..., "
                                 "paths.cache_dir=...), or lower preflight.min_free_gb"))
    return found


def check_inputs(job: Job) -> list[Finding]:
    """What the stages' fingerprints read from outside the config (the official texts from
    the prompts.sources checkouts, the benchmark file): a missing one is named now, in a dry
    run too, not when its stage starts."""
    if check_official(job):  # the official checkouts: reported once, by check_official
        return []
    found = []
    for stage in job.stages:
        if stage.extra_fingerprint is None:
            continue
        try:
            stage.extra_fingerprint(job.config)
        except StructMemError as err:
            found.append(Finding(str(err)))
    return found


def _errata_problem(job: Job) -> str | None:
    """eval.errata (eval/errata.py) names a readable locomo-audit checkout, or one line why not."""
    from structmem_gpu.config.schema import EvalSettings
    from structmem_gpu.eval import errata

    if job.config.settings(EvalSettings).errata is None:
        return None
    try:
        errata.fingerprint(job.config)
    except StructMemError as err:
        return str(err)
    return None


def check_official(job: Job) -> list[Finding]:
    """Every configured official checkout (prompts.sources.*) exists and holds its commit,
    whichever stage reads it (the manifest records them all). Pinned checkouts missing from
    paths.official_dir are one line naming the fetch command."""
    from structmem_gpu.prompts import pinned, sources
    from structmem_gpu.prompts.official import SOURCE_NAMES, source_spec

    found, unfetched = [], []
    paths = job.config.root.paths
    folder = paths.official_dir if paths is not None else None
    for name in SOURCE_NAMES:
        spec = source_spec(job.config, name)
        if spec is None:
            continue
        if folder is not None and spec == pinned.source(name, str(folder)) \
                and not Path(spec.rpartition("@")[0]).exists():
            unfetched.append(f"{pinned.PINNED[name].folder} ({name})")
            continue
        try:
            sources.resolved_commit(sources.parse(f"prompts.sources.{name}", spec))
        except StructMemError as err:
            found.append(Finding(str(err)))
    errata = _errata_problem(job)
    if errata:
        found.append(Finding(errata))
    if unfetched:
        found.append(Finding(
            f"official texts not fetched: paths.official_dir={folder} lacks "
            f"{', '.join(unfetched)}",
            f"{pinned.FETCH_COMMAND} (STRUCTMEM_OFFICIAL_DIR names another folder; "
            "prompts.sources.<name>=null runs on our own wording)"))
    return found


def check_systems(job: Job) -> list[Finding]:
    """A baseline system's stages need its own environment, installed from the committed lock
    (structmem_gpu/systems/envs.py)."""
    from structmem_gpu.systems.stages import SystemSettings, env_problem

    if not any(getattr(s, "settings", None) is SystemSettings for s in job.stages):
        return []
    problem = env_problem(job.config)
    return [Finding(problem)] if problem else []


# The checks, in order; one line adds one. The GPU memory plan is not among them: the dry run
# prints it and exits 2 on a refusal (node/dry_run.print_dry_run), and run_stages, which
# evicts backends by it, refuses the job before any stage (structmem_gpu/node/gpu_plan.py).
CHECKS: list[Callable[[Job], list[Finding]]] = [check_engines, check_models, check_gpu, check_disk,
                                                check_official, check_inputs, check_systems]


def check(config: JobConfig, stages: Sequence[Any], run_dir: Path,
          overrides: Sequence[str] = ()) -> list[Finding]:
    """Every finding of every check (fatal problems and notes)."""
    job = Job(config, stages, Path(run_dir), list(overrides))
    return [f for chk in CHECKS for f in chk(job)]


def enforce(found: Sequence[Finding], *, dry_run: bool) -> None:
    """Log the notes; a real job raises PreflightError on any problem (all in one line); a dry
    run prints them and goes on, unless one blocks even a dry run."""
    found = merged(found)
    problems = [f for f in found if f.fatal]
    for note in (f for f in found if not f.fatal):
        log.info("preflight: %s", note.line())
    if dry_run:
        for f in problems:
            print(f"preflight: {f.line()}", file=sys.stderr, flush=True)
        print(f"preflight: {len(problems)} problem(s) a real job would stop on" if problems
              else "preflight: ok", flush=True)
        problems = [f for f in problems if f.blocks_dry_run]
    if problems:
        raise PreflightError("preflight: " + " | ".join(f.line() for f in problems))
