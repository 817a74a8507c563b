"""The tier check (tests/tiers.py): every test in exactly one tier, refused at collection
otherwise; the tier runner's selection and counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tier_run, tiers
from tests.tiers import GATE, ORDER, TIERS, home_tier, tier_of


def test_a_test_takes_its_directorys_tier() -> None:
    assert home_tier(Path("tests/unit/test_x.py")) == "unit"
    assert home_tier(Path("tests/integration/sub/test_x.py")) == "integration"
    assert home_tier(Path("tests/unitx/test_x.py")) is None  # a prefix is not the directory
    assert tier_of(Path("tests/systems/test_x.py"), []) == ("systems", None)


def test_a_marker_moves_a_test_to_a_deeper_tier() -> None:
    assert tier_of(Path("tests/unit/test_x.py"), ["e2e"]) == ("e2e", None)
    assert tier_of(Path("tests/vllm/test_x.py"), ["vllm_e2e", "vllm_e2e"]) == ("vllm_e2e", None)


def test_no_tier_two_tiers_or_a_gate_tier_outside_its_directory_is_refused() -> None:
    tier, why = tier_of(Path("tests/scratch/test_x.py"), [])
    assert tier is None and "belongs to no tier" in str(why)
    tier, why = tier_of(Path("tests/unit/test_x.py"), ["e2e", "systems"])
    assert tier is None and "2 tiers (e2e, systems)" in str(why)
    tier, why = tier_of(Path("tests/unit/test_x.py"), ["integration"])
    assert tier is None and "runs over tests/integration/ only" in str(why)


def test_every_tier_runs_in_test_all_and_the_gate_comes_first() -> None:
    assert sorted(ORDER) == sorted(TIERS)
    assert ORDER[:len(GATE)] == GATE == ("unit", "integration", "vllm")
    assert tier_run.selection(["gate", "e2e"]) == ["unit", "integration", "vllm", "e2e"]
    with pytest.raises(SystemExit, match="unknown tier 'fast'"):
        tier_run.selection(["fast"])


def test_collection_fails_for_a_test_in_no_tier(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("pytest_plugins = ['tests.tiers']")
    pytester.makepyfile(**{
        "tests/unit/test_ok.py": "def test_ok():\n    pass\n",
        "tests/scratch/test_lost.py": "def test_lost():\n    pass\n",
    })
    result = pytester.runpytest("-p", "no:cacheprovider", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*1 test(s) not in exactly one tier*",
                                 "*tests/scratch/test_lost.py::test_lost belongs to no tier*"])
    assert "test_ok" not in result.stderr.str()


def test_the_tier_marker_selects_and_a_marked_test_leaves_its_directorys_tier(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest("pytest_plugins = ['tests.tiers']")
    pytester.makepyfile(**{
        "tests/unit/test_two.py": ("import pytest\n\ndef test_fast():\n    pass\n\n"
                                   "@pytest.mark.e2e\ndef test_heavy():\n    pass\n"),
    })
    unit = pytester.runpytest("-p", "no:cacheprovider", "-m", "unit", "-q")
    unit.assert_outcomes(passed=1, deselected=1)
    e2e = pytester.runpytest("-p", "no:cacheprovider", "-m", "e2e", "-q", "-rA")
    e2e.assert_outcomes(passed=1, deselected=1)
    e2e.stdout.fnmatch_lines(["*test_heavy*"])


def test_only_the_unit_tiers_tests_are_listed_as_slow_units(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # An e2e test under tests/unit carries "unit" among its keywords (its directory): the
    # summary must go by its tier, not by that keyword. Every test counts as slow here.
    monkeypatch.setattr(tiers, "UNIT_BUDGET_S", -1.0)
    monkeypatch.setattr(tiers, "_unit_seconds", {})
    monkeypatch.setattr(tiers, "_tier_of_node", {})
    pytester.makeconftest("pytest_plugins = ['tests.tiers']")
    pytester.makepyfile(**{
        "tests/unit/test_mixed.py": ("import pytest\n\ndef test_unit_one():\n    pass\n\n"
                                     "@pytest.mark.e2e\ndef test_heavy_one():\n    pass\n"),
    })
    result = pytester.runpytest("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*1 unit test(s) over*", "*test_mixed.py::test_unit_one*"])
    assert "test_heavy_one" not in result.stdout.str()


def test_counts_read_from_the_junit_report(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite name="pytest" tests="7" skipped="2" failures="1" '
                     'errors="0"/></testsuites>')
    result = tier_run.TierResult("unit", 61.0, 1)
    tier_run.counts(junit, result)
    assert (result.passed, result.skipped, result.failed, result.errors) == (4, 2, 1, 0)
    assert result.line() == "unit: 4 passed, 2 skipped, 1 failed, 0 errors in 61 s (1.0 min), exit 1"
