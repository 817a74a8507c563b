"""Run test tiers (tests/tiers.py), one pytest process each and in the order given, and print
each tier's time and counts, then a table of them all (make test, make test-all, make
test-TIER). Exits non-zero when any tier failed or collected nothing.

    python -m tests.tier_run gate            # unit, integration, vllm: CI's gate
    python -m tests.tier_run all             # every tier (tests/tiers.ORDER)
    python -m tests.tier_run e2e -- -k faults  # after --: passed on to pytest
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from tests.tiers import GATE, ORDER, TIERS

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TierResult:
    name: str
    seconds: float
    exit_code: int
    passed: int = 0
    skipped: int = 0
    failed: int = 0
    errors: int = 0

    def line(self) -> str:
        return (f"{self.name}: {self.passed} passed, {self.skipped} skipped, {self.failed} failed, "
                f"{self.errors} errors in {self.seconds:.0f} s ({self.seconds / 60:.1f} min), "
                f"exit {self.exit_code}")


def selection(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        expanded = {"gate": list(GATE), "all": list(ORDER)}.get(name, [name])
        for tier in expanded:
            if tier not in TIERS:
                raise SystemExit(f"tier_run: unknown tier {tier!r} (tiers: {', '.join(TIERS)}; or gate, all)")
            out.append(tier)
    return out


def pytest_command(tier: str, junit: Path, extra: list[str]) -> list[str]:
    """A gate tier runs over its directory (it lives there: tests/tiers.py); a deeper tier's
    tests may sit in any directory, so it collects the whole tree."""
    spec = TIERS[tier]
    paths = [spec.directory] if spec.gate and spec.directory else ["tests"]
    return [sys.executable, "-m", "pytest", "-m", tier, *paths, f"--junitxml={junit}", *extra]


def counts(junit: Path, result: TierResult) -> None:
    if not junit.exists():  # collection refused (tier check, import error): no report
        return
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        tests = int(suite.get("tests", 0))
        result.skipped += int(suite.get("skipped", 0))
        result.failed += int(suite.get("failures", 0))
        result.errors += int(suite.get("errors", 0))
        result.passed += tests - int(suite.get("skipped", 0)) - int(suite.get("failures", 0)) \
            - int(suite.get("errors", 0))


def run_tier(tier: str, extra: list[str]) -> TierResult:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix=f"tier-{tier}-") as tmp:
        junit = Path(tmp) / "junit.xml"
        print(f"\n== tier {tier}: {TIERS[tier].proves}", flush=True)
        t0 = time.monotonic()
        code = subprocess.run(pytest_command(tier, junit, extra), cwd=ROOT, env=env, check=False).returncode
        result = TierResult(tier, time.monotonic() - t0, code)
        counts(junit, result)
    print(f"== tier {result.line()}", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="+", help=f"tier names ({', '.join(TIERS)}), gate or all")
    args = parser.parse_args(argv)
    tiers = selection(args.tiers)
    results = [run_tier(tier, extra) for tier in tiers]
    total = sum(r.seconds for r in results)
    print("\n== tiers run (tests/tiers.py):")
    for r in results:
        print(f"==   {r.line()}")
    print(f"==   total: {total:.0f} s ({total / 60:.1f} min)")
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
