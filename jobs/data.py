"""Download benchmark files and verify their sha256.

    python jobs/data.py                                  # LoCoMo -> data/locomo10.json
    python jobs/data.py locomo longmemeval_s --data-dir /scratch/benchmarks
    python jobs/data.py --check all                      # verify what is there; download nothing
    python jobs/data.py smollm2-hf                       # SmolLM2 GGUF -> HF folder (llm=vllm_cpu)
    python jobs/data.py models <the job's overrides>     # every model that job loads -> HF cache
    python jobs/data.py models --check <overrides>       # are they all here? download nothing
    python jobs/data.py official                         # LightMem, mem0, LongMemEval, audit
    python jobs/data.py official --from /shared/official # from local mirrors (no network)
    python jobs/data.py cache compact [--cache-dir DIR]  # merge cache segments, convert SQLite
    python jobs/data.py cache verify [--cache-dir DIR]   # re-read and check every cached record
    python jobs/data.py systems install mem0 lightrag   # baseline systems' own environments
    python jobs/data.py systems list                     # each system's pin and env state

LoCoMo (CC BY-NC 4.0, never vendored) is checked against the sha256 of the released file.
LongMemEval (Hugging Face dataset xiaowu0162/longmemeval-cleaned) publishes no checksums: the
first download records the sha256 it computed in a sidecar `<file>.sha256` (sha256sum format)
and every later run, and `--check`, verifies the file against it (trust on first use).
Downloads go to a temporary file in the data directory and are renamed into place only after
the checksum is verified, so a killed download never leaves a truncated benchmark file.

Exit codes: 0 ok; 1 `--check` found a missing, unverifiable or mismatched file; 2 a download
or verification failed (one line on stderr, no traceback).

`models` composes the job's config from the same overrides (Hydra's compose API; `-m` expands
a sweep, the experiment's own sweeper params included), lists every model that job loads
(structmem_gpu/node/model_refs.py, the list the job's preflight checks: answer LLM, judges and
panel members, encoder, window-packing tokenizer), prints their total size first (from the
hub's metadata when it answers, else the presets' `weights_gb`), then downloads each with
huggingface_hub's `snapshot_download` into the Hugging Face cache (HF_HOME / HF_HUB_CACHE;
resumable, with a progress bar; tokenizer files only for the window tokenizer). Run it on a
node with network (the login node); the compute node then runs with HF_HUB_OFFLINE=1.
Each cached or downloaded hub model is printed with the snapshot (commit) it resolves to: the
job records it in its manifest (`weights`) and in its response-cache keys when `revision` is
null; pin it with `llm.revision=<snapshot>`.
Exit codes: 0 every model present; 2 a model is missing (`--check`, or a path that cannot be
downloaded) or a download failed. `models` also fetches the official checkouts the job names
(below) when they are missing.

`official` fetches the reference repositories whose texts and data the replication experiments
read at run time (structmem_gpu/prompts/pinned.py: zjunlp/LightMem 8fc9a91, mem0ai/mem0
b3ede5b, xiaowu0162/LongMemEval 9e0b455, dial481/locomo-audit 9493fb4) as bare git repositories into paths.official_dir
(STRUCTMEM_OFFICIAL_DIR, else <data dir>/official), verifies that each holds its pinned commit
and prints where. `--from DIR` fetches from local repositories DIR/lightmem.git, ... instead of
the code host. Exit codes: 0 all present; 1 `--check` found one missing; 2 a fetch failed.

`cache` maintains paths.cache_dir (default .cache/structmem_gpu; its llm/ and embeddings/
segment stores, structmem_gpu/core/segstore.py). `compact` first converts a cache of the SQLite era
(llm/llm_responses.sqlite, embeddings/embeddings.sqlite; run it where SQLite's locks work, the
host that wrote them) into segments and renames the file *.converted, then merges every
published segment into one with one record per key; jobs may keep running meanwhile (a reader
whose segments were merged re-lists once). `verify` re-reads every record and checks its
checksum. Exit codes: 0 ok; 1 `verify` found a damaged segment; 2 a conversion failed.

`systems` installs the baseline memory systems (Mem0, LightRAG, ...), each in its own virtual
environment under paths.systems_dir (STRUCTMEM_SYSTEMS_DIR, else .systems) from its committed
lock (structmem_gpu/systems/envs.py): `install NAME...` (`all` = every system), `download
NAME...` (wheels only, on a login node; `install` then needs no network), `lock NAME`
(maintainers: re-resolve the pins), `list`. Exit codes: 0 ok; 2 an install failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/data.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

# The logic lives in structmem_gpu/fetch/; these names are this entry point's API as well.
from structmem_gpu.core.errors import StructMemError  # noqa: E402
from structmem_gpu.fetch.cache_admin import maintain  # noqa: E402
from structmem_gpu.fetch.datasets import (  # noqa: E402,F401  (Dataset: the tests' fixture data)
    DATASETS, MODELS, Dataset, Fetcher, check, default_cache_dir, default_model_python, ensure,
    ensure_model, http_fetch,
)
from structmem_gpu.config.sweep_points import sweep_points  # noqa: E402,F401
from structmem_gpu.fetch.models import fetch_job_models  # noqa: E402
from structmem_gpu.fetch.official import fetch_official  # noqa: E402
from structmem_gpu.systems.admin import parse_systems_args, systems_command  # noqa: E402

log = logging.getLogger("structmem_gpu.data_job")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="LongMemEval has no published checksums: the first download records the sha256 "
        "it computed in <file>.sha256 and later runs and --check verify against it.",
    )
    parser.add_argument(
        "datasets",
        nargs="*",
        default=["locomo"],
        metavar="DATASET",
        help=f"any of {', '.join(DATASETS)} or 'all' (default: locomo); or the model "
        f"{', '.join(MODELS)}. `models <overrides>` instead fetches every model a job's "
        "config names (`python jobs/data.py models --help`)",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="default: data/")
    parser.add_argument("--check", action="store_true", help="only verify; download nothing")
    parser.add_argument(
        "--force",
        action="store_true",
        help="download again even if present (re-records the sidecar of unpublished checksums)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="models: paths.cache_dir (default .cache/structmem_gpu)",
    )
    parser.add_argument(
        "--python", default=None, help="models: interpreter that converts (default .venv-vllm's)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    names = list(DATASETS) if "all" in args.datasets else list(dict.fromkeys(args.datasets))
    unknown = [n for n in names if n not in DATASETS and n not in MODELS]
    if unknown:
        parser.error(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)} or all")
    args.datasets = names
    return args


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """A command line's arguments as main reads them, nothing run (a bad one exits 2, argparse's
    line): tests/unit/test_docs_links.py checks every command the docs show with it."""
    argv = list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]][0](argv[1:])
    return parse_args(argv)


def main(argv: Sequence[str] | None = None, fetch: Fetcher = http_fetch) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:  # a subcommand, never a dataset name
        return SUBCOMMANDS[argv[0]][1](argv[1:])
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    cache_dir = args.cache_dir or default_cache_dir()
    python = args.python or default_model_python()
    if args.check:
        ok = [
            ensure_model(n, cache_dir, python, check_only=True)
            if n in MODELS
            else check(DATASETS[n], args.data_dir)
            for n in args.datasets
        ]
        return 0 if all(ok) else 1
    try:
        for name in args.datasets:
            if name in MODELS:
                ensure_model(name, cache_dir, python)
                continue
            ensure(DATASETS[name], args.data_dir, fetch=fetch, force=args.force)
    except (StructMemError, OSError) as err:  # OSError: disk full, permissions, …
        log.error("%s", err)
        return 2
    return 0


# ---- subcommands: official, models, cache -------------------------------------------------


def parse_official_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python jobs/data.py official",
        description="Fetch the official reference repositories (bare, pinned commits) into "
        "paths.official_dir.")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="default: data/")
    parser.add_argument("--official-dir", type=Path, default=None,
                        help="default: $STRUCTMEM_OFFICIAL_DIR, else <data dir>/official")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="a folder of local repositories lightmem.git, mem0.git, "
                        "longmemeval.git, locomo-audit.git to fetch from instead of the code host")
    parser.add_argument("--check", action="store_true", help="only verify; fetch nothing")
    return parser.parse_args(list(argv))


def official_main(argv: Sequence[str]) -> int:
    from structmem_gpu.prompts import pinned

    args = parse_official_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    where = args.official_dir or pinned.official_dir_default(args.data_dir)
    return fetch_official(where, args.source, check_only=args.check)


def parse_models_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python jobs/data.py models",
        description="Download every model the job with these overrides loads (answer LLM, "
        "judges, encoder, window tokenizer) into the Hugging Face cache, total size first.",
    )
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="the job's Hydra overrides, e.g. experiment=structmem_locomo")
    parser.add_argument("--check", action="store_true",
                        help="only verify the models are present (exit 2 listing those missing)")
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="the overrides are a sweep: fetch the models of every point")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(list(argv))


def models_main(argv: Sequence[str]) -> int:
    args = parse_models_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(message)s")
    return fetch_job_models(args.overrides, multirun=args.multirun, check=args.check)


def parse_cache_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python jobs/data.py cache",
                                     description="Merge (compact) or check (verify) the LLM "
                                     "response and embedding caches of paths.cache_dir.")
    parser.add_argument("action", choices=("compact", "verify"))
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="paths.cache_dir (default .cache/structmem_gpu)")
    return parser.parse_args(list(argv))


def cache_main(argv: Sequence[str]) -> int:
    args = parse_cache_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    return maintain(args.cache_dir or default_cache_dir(), args.action)


# name -> (its parser, its entry point): `python jobs/data.py NAME ...`
SUBCOMMANDS: dict[str, tuple[Callable[..., argparse.Namespace], Callable[..., int]]] = {
    "models": (parse_models_args, models_main),
    "official": (parse_official_args, official_main),
    "cache": (parse_cache_args, cache_main),
    "systems": (parse_systems_args, systems_command),
}


if __name__ == "__main__":
    sys.exit(main())
