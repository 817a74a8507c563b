"""Compare finished runs: comparison.md / .csv / .json, one row per run.

    python jobs/compare.py outputs/multirun/sample/2026-05-01_12-00-00          # a multirun
    python jobs/compare.py RUN_DIR_A RUN_DIR_B --out outputs/compare --reference structmem

Every directory given is searched for run directories (those with report/report.json); the
output goes to --out (default: the single directory given, else the current directory).
Thin wrapper over structmem_gpu.eval.compare.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/compare.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.errors import StructMemError
from structmem_gpu.eval.compare import compare_runs, discover_runs, write_comparison

log = logging.getLogger("structmem_gpu.compare")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="run directories or folders holding them")
    ap.add_argument("--out", type=Path, default=None, help="where comparison.* go")
    ap.add_argument(
        "--reference", default="structmem", help="method the build-call ratio is relative to"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        runs = discover_runs(*args.dirs)
        df = compare_runs(runs, reference=args.reference)
        out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path.cwd())
        paths = write_comparison(df, out, reference=args.reference)
    except StructMemError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paths["md"].read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
