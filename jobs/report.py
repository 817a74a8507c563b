"""Merge shard runs, compare runs, and measure judge agreement.

    # the 16 run directories of a sharded job array -> one run directory + one report
    python jobs/report.py merge outputs/locomo16/merged outputs/locomo16
    python jobs/report.py merge OUT SHARD_DIR_0 SHARD_DIR_1 ... [--force] [--no-report]
    # a sweep crossed with shards (seed_k=0,5 x shard_index=0..3) -> OUT/<overrides>/ per config
    python jobs/report.py merge outputs/seed_k_merged outputs/seed_k_sharded --by-config
    # several finished runs (e.g. a sweep) -> comparison.md / .csv / .json in OUT, with paired
    # tests against the reference run (paired.csv/.json) and build-seed replicates (seeds.json)
    python jobs/report.py compare outputs/compare outputs/multirun/sample/2026-05-01_12-00-00
    # StructMem's Table 1: each run (e.g. of experiment=structmem_table1) beside the paper's row
    # for its method, scores and build cost, paired against StructMem -> table1.md/.csv/.json
    python jobs/report.py table1 outputs/table1 outputs/multirun/locomo/2026-05-01_12-00-00
    # log finished runs or a sweep (parent + a child per point) to MLflow after the fact
    python jobs/report.py track outputs/multirun/sample/2026-05-01_12-00-00 --uri file:/abs/mlruns
    # Cohen's kappa per judge pair + Fleiss' kappa (judge=panel_example runs)
    python jobs/report.py agreement outputs/runs/locomo/structmem
    # one run's answers scored under every published protocol -> report/protocols.md/.json
    python jobs/report.py protocols outputs/runs/locomo/structmem
    # predictions in the files an official scorer reads (LongMemEval, mem0, LightMem)
    python jobs/report.py export outputs/runs/locomo/structmem --format mem0
    # the judge's false-accept / false-reject rates on dial481/locomo-audit's answer sets
    # (stored per judge identity; report.md and compare show them beside the judge)
    python jobs/report.py judge-audit judge=same_as_llm [eval.judge_audit.per_set=null] [--force]
    # an official pipeline's run against our port's, request by request -> RUN_PORT/differential/
    python jobs/report.py differential RUN_OFFICIAL RUN_PORT [--out DIR] [--cache-dir DIR] [--k 10]

A folder that is not itself a run directory (a multirun sweep dir) stands for the run
directories below it. Expected errors (a missing shard, shards of different configs) print
one line naming the shard and exit with code 2. Thin wrapper over structmem_gpu.run.merge,
structmem_gpu.analysis.compare, .differential and structmem_gpu.eval.agreement.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/report.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.core.errors import StructMemError  # noqa: E402

log = logging.getLogger("structmem_gpu.report")
CONF_DIR = ROOT / "conf"


def _compose(overrides: list[str]) -> DictConfig:
    """The job config for these overrides (shards run in-process have no .hydra/ to read)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def cmd_merge(args: argparse.Namespace) -> int:
    from structmem_gpu.run.merge import discover_run_dirs, group_by_config, merge_shards

    shard_dirs = discover_run_dirs(args.dirs)
    from structmem_gpu.config.job import JobConfig

    # the configuration the merged report renders with, read typed from here on
    cfg = JobConfig.from_cfg(_compose(args.override)) if args.override else None
    groups = group_by_config(shard_dirs) if args.by_config else {"": shard_dirs}
    for name, dirs in groups.items():
        out = args.out / name if name else args.out
        result = merge_shards(dirs, out, cfg, report=not args.no_report, overwrite=args.force)
        print(f"merged {len(result.shards)} shards into {result.out_dir}")
        for table, rows in sorted(result.tables.items()):
            print(f"  {table:24s} {rows:>8d} rows")
        if result.report is not None:
            print(f"report: {result.report.parent / 'report.md'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from structmem_gpu.analysis.commands import compare_command

    compare_command(args.out, args.dirs, args.reference)
    return 0


def cmd_table1(args: argparse.Namespace) -> int:
    from structmem_gpu.analysis.commands import table1_command

    table1_command(args.out, args.dirs)
    return 0


def cmd_agreement(args: argparse.Namespace) -> int:
    from structmem_gpu.analysis.commands import agreement_command

    agreement_command(args.run_dir, args.out)
    return 0


def cmd_track(args: argparse.Namespace) -> int:
    from structmem_gpu.analysis.tracking import track_dirs

    track_dirs(args.dirs, uri=args.uri, experiment=args.experiment)
    return 0


def run_config(run_dir: Path, overrides: Sequence[str], compose: Any) -> DictConfig:
    """The run's saved Hydra config with `overrides` (KEY=VALUE) on top; without a saved one
    (a run made in-process), the config composed from `overrides` by `compose`."""
    from omegaconf import OmegaConf

    saved = run_dir / ".hydra" / "config.yaml"
    if saved.is_file():
        cfg = OmegaConf.load(saved)
        assert OmegaConf.is_dict(cfg)
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        assert OmegaConf.is_dict(cfg)
        return cfg  # type: ignore[return-value]
    if not overrides:
        raise StructMemError(f"{run_dir}: no .hydra/config.yaml; pass the run's overrides "
                             "(--override KEY=VALUE ...)")
    return compose(list(overrides))


def cmd_protocols(args: argparse.Namespace) -> int:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.eval.protocols import write_protocols

    job = JobConfig.from_cfg(run_config(args.run_dir, args.override, _compose))
    summary = write_protocols(job, args.run_dir, args.out, args.judge)
    print(Path(summary["paths"]["md"]).read_text(encoding="utf-8"))
    print(f"written: {summary['paths']['md']}, {summary['paths']['json']}")
    return 0


def cmd_judge_audit(args: argparse.Namespace) -> int:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.eval.judge_audit import print_audits

    print_audits(JobConfig.from_cfg(_compose(list(args.overrides))), args.force, args.judge)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from structmem_gpu.eval.export import export_run

    for path in export_run(args.run_dir, args.format, args.out):
        print(f"written: {path}")
    return 0


def cmd_differential(args: argparse.Namespace) -> int:
    from structmem_gpu.analysis.differential import differential
    from structmem_gpu.analysis.differential_report import default_out, write_differential

    diff = differential(args.official, args.port, args.cache_dir, args.k)
    paths = write_differential(diff, args.out or default_out(args.official, args.port))
    print(paths["md"].read_text("utf-8") + "written: " + ", ".join(map(str, paths.values())))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge the shard run directories of one job")
    m.add_argument("out", type=Path, help="merged run directory to create")
    m.add_argument("dirs", nargs="+", type=Path, help="shard run directories or a sweep dir")
    m.add_argument("--force", action="store_true", help="replace an existing merged directory")
    m.add_argument("--no-report", action="store_true", help="merge tables only")
    m.add_argument("--by-config", action="store_true", help="a sweep crossed with shards: merge "
                   "each config's shards into OUT/<its overrides>")
    m.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                   help="Hydra overrides of the shards' job, when they have no .hydra/config.yaml")
    m.set_defaults(fn=cmd_merge)
    c = sub.add_parser("compare", help="compare finished runs (comparison.md/.csv/.json)")
    c.add_argument("out", type=Path, help="where comparison.* go")
    c.add_argument("dirs", nargs="+", type=Path, help="run directories or folders holding them")
    c.add_argument("--reference", default="structmem",
                   help="method (its first run in the table's order) or run directory: what "
                        "build-call ratios and the paired tests refer to")
    c.set_defaults(fn=cmd_compare)
    t1 = sub.add_parser("table1", help="StructMem's Table 1: each run beside the paper's row "
                        "(scores, build cost, paired tests against StructMem)")
    t1.add_argument("out", type=Path, help="where table1.* and index.html go")
    t1.add_argument("dirs", nargs="+", type=Path, help="run directories or folders holding "
                    "them (e.g. the multirun of experiment=structmem_table1)")
    t1.set_defaults(fn=cmd_table1)
    a = sub.add_parser("agreement", help="judge agreement (Cohen's / Fleiss' kappa)")
    a.add_argument("run_dir", type=Path, help="run directory whose judgments have several judges")
    a.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report")
    a.set_defaults(fn=cmd_agreement)
    t = sub.add_parser("track", help="log finished runs / sweeps to MLflow after the fact")
    t.add_argument("dirs", nargs="+", type=Path, help="sweep dirs, run dirs or folders of runs")
    t.add_argument("--uri", default=None, help="tracking store (default file:outputs/mlruns)")
    t.add_argument("--experiment", default=None, help="default structmem-<benchmark>")
    t.set_defaults(fn=cmd_track)
    p = sub.add_parser("protocols", help="score a run under every published protocol")
    p.add_argument("run_dir", type=Path, help="finished run directory (answers.parquet)")
    p.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report")
    p.add_argument("--judge", default=None, help="judge name of the run (default: the first)")
    p.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                   help="on top of RUN_DIR/.hydra/config.yaml (or the run's overrides when it "
                        "has none), e.g. prompts.sources.mem0=PATH@b3ede5b")
    p.set_defaults(fn=cmd_protocols)
    e = sub.add_parser("export", help="predictions in the format an official scorer reads")
    e.add_argument("run_dir", type=Path, help="finished run directory (answers, judgments)")
    e.add_argument("--format", required=True, choices=("longmemeval", "mem0", "lightmem"))
    e.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report/export/FORMAT")
    e.set_defaults(fn=cmd_export)
    j = sub.add_parser("judge-audit", help="the judge's error rates on answer sets of known truth")
    j.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of the "
                   "job whose judge is audited, e.g. eval.judge_audit.per_set=null")
    j.add_argument("--judge", default=None, help="one judge of the panel (default: every one)")
    j.add_argument("--force", action="store_true",
                   help="judge again (replies still come from the response cache)")
    j.set_defaults(fn=cmd_judge_audit)
    d = sub.add_parser("differential", help="an official pipeline's requests against our port's")
    d.add_argument("official", type=Path, help="run of the official pipeline (through the front)")
    d.add_argument("port", type=Path, help="run of our port")
    d.add_argument("--out", type=Path, help="default: PORT/differential/<OFFICIAL's name>")
    d.add_argument("--cache-dir", type=Path, help="the runs' paths.cache_dir (default: saved)")
    d.add_argument("--k", type=int, help="retrieved items compared per question (default 10)")
    d.set_defaults(fn=cmd_differential)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.fn(args))
    except StructMemError as err:
        log.error("%s", err)
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
