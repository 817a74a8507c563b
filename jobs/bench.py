"""Performance and scale harness: throughput, overhead and cost against the reference schedule.

    python jobs/bench.py                        # default CPU suite -> outputs/bench/<time>/
    python jobs/bench.py llm schedule           # selected parts
    python jobs/bench.py client                 # client ceiling vs a zero-latency mock (no LLM)
    python jobs/bench.py --tiny llm.base_url=http://127.0.0.1:8080/v1     # CI smoke sizes
    python jobs/bench.py cost --run-dir outputs/runs/locomo/structmem
    python jobs/bench.py lme-load --lme-questions 100,500   # LongMemEval-M-shaped load memory
    python jobs/bench.py lme-count --lme-file data/longmemeval_m_cleaned.json   # what repeats
    python jobs/bench.py --profile gpu llm=vllm_server llm.model=Qwen/Qwen2.5-7B-Instruct \\
        llm.served_name=qwen2.5-7b embedder.device=cuda    # GPU node (see docs/performance.md "Benchmarking")

    python jobs/bench.py paced                  # builds against a GPU-paced mock (simulation)
    python jobs/bench.py lme-groups --lme-group-questions 50,100,200 --lme-group 25
                                                # scripted question-grouped M builds: peak RSS

Parts: client, llm, build, schedule, components, cost, scale, dry-run, lme-count, lme-load
(default: all of these), paced and lme-groups (only when named). Other arguments of the form key=value are Hydra overrides of
conf/ applied to every pipeline run. Writes bench.json and bench.md into --out; exit code 1 when
a part failed. Logic lives in
structmem_gpu/bench/; this is the CLI only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/bench.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.bench.harness import BenchSettings  # noqa: E402
from structmem_gpu.bench.paced_model import ENGINES  # noqa: E402
from structmem_gpu.bench.suite import (  # noqa: E402
    DEFAULT_PARTS,
    PARTS,
    PROFILE_OVERRIDES,
    SuiteOptions,
    failed_parts,
    run_suite,
)

log = logging.getLogger("structmem_gpu.bench")


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str], list[str]]:
    ap = argparse.ArgumentParser(
        description="structmem-gpu performance and scale harness",
        epilog=f"parts: {', '.join(PARTS)}; key=value arguments are Hydra overrides",
    )
    ap.add_argument("items", nargs="*", help="parts to run and/or Hydra overrides (key=value)")
    ap.add_argument(
        "--profile",
        choices=sorted(PROFILE_OVERRIDES),
        default="cpu",
        help="cpu: debug=ci caps, small sizes (<15 min on 2 cores); gpu: LoCoMo-sized components",
    )
    ap.add_argument(
        "--tiny", action="store_true", help="CI smoke sizes (~11 uncached LLM requests)"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="bench directory (default outputs/bench/<time>)"
    )
    ap.add_argument("--run-dir", type=Path, default=None, help="`cost`: the run directory to read")
    ap.add_argument(
        "--locomo",
        type=Path,
        default=os.environ.get("STRUCTMEM_LOCOMO_PATH") or None,
        help="LoCoMo file for the full-benchmark dry-run estimate (default $STRUCTMEM_LOCOMO_PATH)",
    )
    ap.add_argument("--sizes", default=None, help="`scale`: conversation counts, e.g. 10,100,1000")
    ap.add_argument(
        "--scale-encoder",
        choices=("hashing", "configured"),
        default=None,
        help="`scale`: encoder of the scripted runs (default: hashing on cpu, configured on gpu)",
    )
    ap.add_argument(
        "--schedule-slice",
        default=None,
        help="`schedule`: N,M = first N conversations, M sessions (default: the build's data "
        "on cpu, 2,6 on gpu; 0,0 = the build's data)",
    )
    ap.add_argument(
        "--lme-questions",
        default=None,
        help="`lme-load`: question counts of the LongMemEval-M-shaped files (500 sessions each "
        "from a pool of 20,000), e.g. 100,500 (default: 100; tiny: 4)",
    )
    ap.add_argument("--lme-dates", default="per_haystack",
                    help="`lme-load`: date shapes of the synthetic files, per_haystack "
                         "(LongMemEval's recipe) and/or fixed, comma-separated")
    ap.add_argument("--lme-group-questions", default="50,100,200",
                    help="`lme-groups`: question counts of the scripted question-grouped builds")
    ap.add_argument("--lme-group", type=int, default=25,
                    help="`lme-groups`: question_groups (questions per group) of those builds")
    ap.add_argument("--lme-file", type=Path, default=None,
                    help="`lme-count`: a real LongMemEval file (default: benchmark=longmemeval's "
                         "path when it exists)")
    ap.add_argument("--paced-sizes", default="locomo,longmemeval_s",
                    help="`paced`: comma-separated synthetic sizes, the names of bench/paced.py "
                         "SIZES (docs/performance.md \"GPU-paced builds\" describes them)")
    ap.add_argument("--paced-builds", default="structmem,seem", help="`paced`: builds to run")
    ap.add_argument("--paced-time-scale", type=float, default=10.0,
                    help="`paced`: the mock runs the GPU model this many times faster")
    ap.add_argument("--paced-no-prefix-caching", action="store_true",
                    help="`paced`: charge every prompt token (vLLM --no-enable-prefix-caching)")
    ap.add_argument("--paced-engine", default="bf16", choices=ENGINES,
                    help="`paced`: the engine the mock plays: bf16 (the reference setting) or fp8 "
                         "(llm=vllm_llama3_1_8b_fp8, a deviation; every step / 1.6, the vLLM "
                         "docs' published FP8 throughput gain)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_intermixed_args(argv)  # parts, options and overrides in any order
    overrides = [i for i in args.items if "=" in i]
    parts = [i for i in args.items if "=" not in i]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; expected some of {list(PARTS)}")
    return args, parts, overrides


def main(argv: list[str] | None = None) -> int:
    args, parts, overrides = parse(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
    )
    log.setLevel(logging.INFO)
    logging.getLogger("structmem_gpu.bench").setLevel(logging.INFO)
    out = args.out or ROOT / "outputs" / "bench" / time.strftime("%Y%m%d-%H%M%S")
    settings = BenchSettings(
        conf_dir=ROOT / "conf",
        out_dir=out.resolve(),
        profile_overrides=PROFILE_OVERRIDES[args.profile],
        user_overrides=tuple(overrides),
        tiny=args.tiny,
    )
    sizes = tuple(int(x) for x in args.sizes.split(",")) if args.sizes else None
    cut = tuple(int(x) for x in args.schedule_slice.split(",")) if args.schedule_slice else None
    opts = SuiteOptions(
        parts=tuple(parts) or DEFAULT_PARTS,
        profile=args.profile,
        tiny=args.tiny,
        cost_run_dir=args.run_dir,
        locomo_path=args.locomo,
        sizes=sizes,
        scale_encoder=args.scale_encoder,
        schedule_slice=cut,
        lme_questions=tuple(int(x) for x in args.lme_questions.split(","))
        if args.lme_questions
        else None,
        lme_dates=tuple(args.lme_dates.split(",")),
        lme_group_questions=tuple(int(x) for x in args.lme_group_questions.split(",")),
        lme_group=args.lme_group,
        lme_file=args.lme_file,
        paced_sizes=tuple(args.paced_sizes.split(",")),
        paced_builds=tuple(args.paced_builds.split(",")),
        paced_time_scale=args.paced_time_scale,
        paced_prefix_caching=not args.paced_no_prefix_caching,
        paced_engine=args.paced_engine,
    )  # type: ignore[arg-type]
    bench = run_suite(settings, opts)
    print((out / "bench.md").read_text())
    print(f"bench directory: {out}  (bench.json, bench.md; {bench['meta']['wall_s']:.0f} s)")
    failed = failed_parts(bench)
    if failed:
        print(f"error: bench part(s) failed: {failed} (see bench.json)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
