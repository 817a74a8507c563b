"""Shared pytest configuration. Fixtures live in tests/fixtures/* (one module per area)."""

pytest_plugins = [
    "pytester",  # tests/unit/test_tiers.py runs the tier check on a made-up tree
    "tests.tiers",  # every test in exactly one tier, checked at collection
    "tests.fixtures.compose_cache",  # first: later modules import the memoised compose
    "tests.fixtures.data",
    "tests.fixtures.llm",
    "tests.fixtures.lingua",
    "tests.fixtures.pipeline",
    "tests.fixtures.vllm",
    "tests.fixtures.yaml_cache",
]
