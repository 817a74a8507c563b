"""Generated parts of the documentation.

    python jobs/docs.py configuration           # docs/configuration.md's knob tables from the models
    python jobs/docs.py configuration --check   # exit 1 when they are stale (nothing written)

Logic: structmem_gpu/config/knob_docs.py. Exit codes: 0 up to date or rewritten; 1 `--check`
found a stale file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/docs.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("configuration", help="docs/configuration.md's knob tables")
    c.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from structmem_gpu.config import knob_docs

    return knob_docs.main(check=args.check)


if __name__ == "__main__":
    sys.exit(main())
