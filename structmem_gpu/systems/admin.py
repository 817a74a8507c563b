"""`python jobs/data.py systems ...`: install, download, lock and list the baseline systems'
environments (structmem_gpu/systems/envs.py). Exit codes: 0 ok; 2 a step failed (one line)."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from structmem_gpu.core.errors import StructMemError
from structmem_gpu.systems import envs
from structmem_gpu.systems.registry import system_names, system_spec

log = logging.getLogger("structmem_gpu.data_job")


def parse_systems_args(argv: Sequence[str]) -> argparse.Namespace:
    """`python jobs/data.py systems ...`'s arguments (a bad command line exits 2, argparse's)."""
    parser = argparse.ArgumentParser(prog="python jobs/data.py systems",
                                     description="The baseline systems' own environments.")
    parser.add_argument("action", choices=("install", "download", "lock", "list"))
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="systems, or `all` (default), `ci`, `heavy` (their test tiers)")
    parser.add_argument("--systems-dir", type=Path, default=None,
                        help="default: $STRUCTMEM_SYSTEMS_DIR, else .systems")
    parser.add_argument("--force", action="store_true",
                        help="install: rebuild an environment already installed from its lock")
    # intermixed: `install --systems-dir D ci` (the Makefile's order) keeps `ci` a NAME; plain
    # parse_args binds the empty NAME list before the option and refuses the name after it
    return parser.parse_intermixed_args(list(argv))


def systems_command(argv: Sequence[str]) -> int:
    args = parse_systems_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    where = args.systems_dir or Path(os.environ.get("STRUCTMEM_SYSTEMS_DIR") or ".systems")
    # `all`, or a tier (`ci`, `heavy`: SystemSpec.tier), or names
    groups = {"all": system_names(), "ci": system_names("ci"), "heavy": system_names("heavy")}
    names = [n for arg in (args.names or ["all"]) for n in groups.get(arg, [arg])]
    done: set[str] = set()  # environments handled (mem0_graph runs in mem0's)
    try:
        for name in names:
            spec = system_spec(name)
            if args.action != "list" and spec.env_name in done:
                continue
            done.add(spec.env_name)
            if args.action == "list":
                state = envs.env_state(spec, where)
                ok = state is not None and state.get("lock_sha256") == envs.lock_sha256(spec)
                print(f"{name:12s} {spec.source:40s} "
                      f"{'installed' if ok else 'stale' if state else 'not installed'}")
            elif args.action == "install":
                state = envs.env_state(spec, where)
                if state and not args.force and state.get("lock_sha256") == envs.lock_sha256(spec):
                    log.info("%s: installed (%s), same lock", spec.env_name, envs.env_dir(spec, where))
                    continue
                official = Path(os.environ.get("STRUCTMEM_OFFICIAL_DIR") or "data/official")
                if (spec.repository is not None and name not in (args.names or [])
                        and not (official / spec.repository[0]).exists()):
                    # a tier's repository-released system without its checkout (seem_skill in
                    # `ci`): skipped with a warning, as its tests skip; named, it fails
                    log.warning("%s: skipped, no %s in %s (STRUCTMEM_OFFICIAL_DIR); its tests "
                                "skip", name, spec.repository[0], official)
                    continue
                state = envs.install(spec, where, official_dir=official)
                log.info("%s: installed in %s s at %s", name, state["installed_s"],
                         envs.env_dir(spec, where))
            elif args.action == "download":
                log.info("%s: wheels in %s", name, envs.download(spec, where))
            else:
                log.info("%s: lock written to %s", name, envs.lock(spec))
    except (StructMemError, OSError, subprocess.CalledProcessError) as err:
        log.error("%s", err)
        return 2
    return 0
