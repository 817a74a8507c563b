"""Shared pytest configuration. Fixtures live in tests/fixtures/* (one module per area)."""

pytest_plugins = [
    "tests.fixtures.data",
    "tests.fixtures.llm",
    "tests.fixtures.lingua",
    "tests.fixtures.pipeline",
    "tests.fixtures.vllm",
    "tests.fixtures.yaml_cache",
]
