"""The LLM profile's budgets reach the stages: the CPU profile caps a 135M model's work, GPU
profiles and the replication experiments keep the paper's values (paper A.3, reference code)."""

from __future__ import annotations

import pytest

from tests.fixtures.pipeline import compose_cfg


def _reader(cfg) -> tuple[int, int, int, int]:
    return (int(cfg.retrieve.entries_k), int(cfg.retrieve.syntheses_k),
            int(cfg.extract.max_item_chars), int(cfg.answer.max_tokens))


def test_cpu_profile_caps_reader_context_items_and_replies() -> None:
    cfg = compose_cfg([])  # the quick-start job: llm=llamacpp_cpu
    budgets = cfg.llm.budgets
    assert _reader(cfg) == (budgets.reader_entries_k, budgets.reader_syntheses_k,
                            budgets.extract_max_item_chars, budgets.answer_max_tokens)
    assert cfg.retrieve.entries_k < 60 and cfg.retrieve.syntheses_k < 5
    assert cfg.consolidate.max_tokens == budgets.synthesis_max_tokens


@pytest.mark.parametrize("llm", ["vllm_server", "vllm_qwen2_5_7b", "scripted"])
def test_other_profiles_keep_the_paper_reader_context(llm: str) -> None:
    assert _reader(compose_cfg([f"llm={llm}"])) == (60, 5, 400, 512)


def test_replication_experiment_pins_the_reader_context_on_any_profile() -> None:
    cfg = compose_cfg(["experiment=structmem_locomo"])  # CPU profile still selected
    assert (cfg.retrieve.entries_k, cfg.retrieve.syntheses_k) == (60, 5)


@pytest.mark.parametrize("method", ["flat", "graph_memory"])
def test_paradigm_baselines_read_the_same_entry_budget_without_syntheses(method: str) -> None:
    # experiment=paradigms compares these with StructMem: one entry budget per profile for all.
    cpu = compose_cfg([f"method={method}"])
    gpu = compose_cfg([f"method={method}", "llm=vllm_server"])
    assert cpu.retrieve.entries_k == cpu.llm.budgets.reader_entries_k and cpu.retrieve.syntheses_k == 0
    assert gpu.retrieve.entries_k == 60
