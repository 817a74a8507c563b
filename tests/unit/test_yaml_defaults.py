"""Each knob is written once: the YAML default blocks are generated from the models
(structmem_gpu/config/yaml_defaults.py), and a knob added to a model is validated, overridable
from the command line, hashed per its role and documented with no other file touched."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from structmem_gpu.config import yaml_defaults
from structmem_gpu.config.identity import identity
from structmem_gpu.config.settings import COUNT, RUN_ROLE, SIZE, Settings, describe_field, yaml_expr
from structmem_gpu.core.errors import ConfigError
from tests.fixtures.pipeline import CONF_DIR, compose_cfg


def test_generated_blocks_match_the_models() -> None:
    assert yaml_defaults.differences() == [], (
        "conf/ differs from the models: run python -m structmem_gpu.config.yaml_defaults")


GENERATED = yaml_defaults.generated_models()


_yaml_fields = yaml_defaults.yaml_fields


def test_the_stage_nodes_are_generated() -> None:
    """No hand-written list: the generator finds the root nodes and the stages' models itself."""
    homes = yaml_defaults.discover()
    # "" = the root keys (JobSettings' own leaves and prompts)
    assert set(homes["config.yaml"]) == {"", "gpu", "cache", "preempt", "preflight", "report", "eval"}
    # Each group's base is generated from its model; its profiles state only what differs.
    for group in ("llm", "embedder", "judge", "tracking"):
        assert set(homes[f"{group}/_base.yaml"]) == {group}
    assert set(homes["method/structmem.yaml"]) >= {
        "extract", "compress", "segment", "consolidate", "update", "retrieve"}
    # Every method's reader block has one base, which each method lists in its defaults.
    assert set(homes["method/_answer.yaml"]) == {"answer"}
    # One block from two models: StructMem's entries_k/syntheses_k first (its home implements
    # the stage), then turn_rag's turns_k.
    assert [m.__name__ for m in homes["method/structmem.yaml"]["retrieve"]] == [
        "RetrieveSettings", "TurnRetrieveSettings"]
    assert not hasattr(yaml_defaults, "GENERATED")


@pytest.mark.parametrize("model", GENERATED, ids=lambda m: f"{m.__module__}.{m.__name__}")
def test_composed_defaults_are_the_models_defaults(model: type[Settings]) -> None:
    home = Path(str(model.yaml_home))
    choice = {"method": f"method={home.stem}"}
    if model.node:  # a group's base (conf/llm/_base.yaml ...)
        choice[model.node] = f"{model.node}={home.stem}"
    cfg = compose_cfg([choice[home.parent.name]] if home.parent.name in choice else [])
    node = OmegaConf.to_container(OmegaConf.select(cfg, model.node) if model.node else cfg,
                                  resolve=False)
    written = [n for m in GENERATED if m.node == model.node and m.yaml_home == model.yaml_home
               for n in _yaml_fields(m)]
    if model.node:
        assert list(node) == list(dict.fromkeys(written))  # every key is in the YAML: overridable
    else:  # the root: its keys among the groups' and blocks' nodes
        assert set(written) <= set(node)
    for name, f in _yaml_fields(model).items():
        expr = yaml_expr(f)
        if expr is None:
            if isinstance(f.default, Settings):  # a nested block: its own expressions resolved
                resolved = OmegaConf.to_container(cfg, resolve=True)
                for part in filter(None, (*model.node.split("."), name)):
                    resolved = resolved[part]
                assert resolved == f.default.model_dump(), name
                continue
            default = f.default
            assert node[name] == (list(default) if isinstance(default, tuple) else default), name
        else:
            # The YAML keeps the interpolation; the Python default is what it resolves to
            # when the profile sets nothing.
            assert node[name] == expr, name
            assert OmegaConf.create({"v": expr}).v == f.default, name


def test_a_changed_default_or_comment_is_found(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    for name, old, new in (
            ("config.yaml", "  grace_s: 20.0\n", "  grace_s: 30\n"),
            ("config.yaml", "kill wait (SLURM KillWait", "kill wait (KillWait"),
            # a stage node: a value, an interpolation kept as the YAML default, a comment, a
            # key written by hand that no field declares, a key dropped
            ("method/structmem.yaml", "  seed_k: 15\n", "  seed_k: 10\n"),
            ("method/structmem.yaml", "extract_max_tokens,4096}", "extract_max_tokens,2048}"),
            ("method/structmem.yaml", "(paper Fig. 3d sweeps", "(Fig. 3d sweeps"),
            ("method/structmem.yaml", "  turns_k: 20\n", "  turns_k: 20\n  stray: 1\n"),
            ("method/_answer.yaml", "  speaker_groups: 2\n", ""),
            # nested nodes, a group file that is the node, the default judge
            ("method/seem.yaml", "    p_ret_k: 5\n", "    p_ret_k: 6\n"),
            ("method/graph_memory.yaml", "    relation_dedup: 256\n", "    relation_dedup: 128\n"),
            ("method/graph_memory.yaml", "  question_entities_k: 3\n", "  question_entities_k: 4\n"),
            ("audit/default.yaml", "  max_links: 8\n", "  max_links: 9\n"),
            ("judge/_base.yaml", "max_tokens: 128\n", "max_tokens: 64\n"),
            # the root keys, a group's base
            ("config.yaml", "num_shards: 1\n", "num_shards: 2\n"),
            ("llm/_base.yaml", "n_ctx: 8192\n", "n_ctx: 4096\n")):
        path = conf / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        assert yaml_defaults.differences(conf) == [str(path)]
        path.write_text(text)
    assert yaml_defaults.differences(conf) == []


class Fixture(Settings):
    """A stage node as a developer writes it (test fixture)."""

    node: ClassVar[str] = "fixture"

    window: SIZE = Field(4, description="Turns per window.")
    workers: Annotated[SIZE, RUN_ROLE] = Field(2, description="Worker threads: how it runs, never hashed.")


class FixtureWithKnob(Settings):
    """The same node after the developer added one knob: one field, nothing else."""

    node: ClassVar[str] = "fixture"

    window: SIZE = Field(4, description="Turns per window.")
    workers: Annotated[SIZE, RUN_ROLE] = Field(2, description="Worker threads: how it runs, never hashed.")
    new_knob: COUNT = Field(5, description="Entries kept per window; 0 keeps none.")


def _conf_with(tmp_path: Path, model: type[Settings]) -> Path:
    """A copy of conf/ whose config.yaml has `model`'s block, as the generator writes it."""
    conf = tmp_path / "conf"
    if not conf.exists():
        shutil.copytree(CONF_DIR, conf)
        path = conf / "config.yaml"
        path.write_text(path.read_text() + "\nfixture:\n")
    path = conf / "config.yaml"
    path.write_text(yaml_defaults.regenerate(path.read_text(), [model]))
    return conf


def _compose(conf: Path, overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _files(conf: Path) -> dict[str, str]:
    return {str(p.relative_to(conf)): p.read_text() for p in sorted(conf.rglob("*.yaml"))}


def test_a_new_knob_is_validated_overridable_hashed_and_documented(tmp_path: Path) -> None:
    conf = _conf_with(tmp_path, Fixture)
    before = _files(conf)
    with pytest.raises(Exception):  # Hydra refuses a key the YAML lacks
        _compose(conf, ["fixture.new_knob=7"])

    _conf_with(tmp_path, FixtureWithKnob)  # the generator, after the one-field edit
    after = _files(conf)
    # No other file touched: only config.yaml's fixture block gained the knob and its comment.
    assert {k for k in after if after[k] != before[k]} == {"config.yaml"}
    added = [ln for ln in after["config.yaml"].splitlines()
             if ln not in before["config.yaml"].splitlines()]
    assert added == ["  # Entries kept per window; 0 keeps none.", "  new_knob: 5"]

    # Overridable from the command line (no `+`), with the model's default otherwise.
    assert FixtureWithKnob.from_cfg(_compose(conf, [])).new_knob == 5
    s = FixtureWithKnob.from_cfg(_compose(conf, ["fixture.new_knob=7"]))
    assert s.new_knob == 7
    # Validated: one line naming the key and what is allowed.
    with pytest.raises(ConfigError) as err:
        FixtureWithKnob.from_cfg(_compose(conf, ["fixture.new_knob=-1"]))
    assert str(err.value) == "config fixture.new_knob=-1: expected an integer >= 0 (0 = off)"
    assert describe_field(FixtureWithKnob.model_fields["new_knob"]) == "an integer >= 0 (0 = off)"
    # Hashed per its role: a result knob enters the stage fingerprint, a run knob never does.
    assert identity(s) == {"window": 4, "new_knob": 7}
    # Documented: its description is the YAML comment above it (and the model's field doc).
    assert FixtureWithKnob.model_fields["new_knob"].description in after["config.yaml"]


def test_the_grace_and_answer_budget_have_one_home_each() -> None:
    import inspect

    from structmem_gpu.config.schema import PreemptSettings
    from structmem_gpu.core.preempt import PreemptionGuard

    # A config without the preempt block (an older saved one) gets the model's grace, the same
    # value conf/config.yaml shows (generated); the guard itself has no default of its own.
    assert PreemptSettings.from_cfg({}).grace_s == 20.0 == compose_cfg([]).preempt.grace_s
    assert inspect.signature(PreemptionGuard).parameters["grace_s"].default is inspect.Parameter.empty
    # The profile's answer budget reaches every short-answer reader (the CPU profile's 48).
    for method in ("seem", "turn_rag", "full_context", "structmem"):
        assert compose_cfg([f"method={method}"]).answer.max_tokens == 48
        assert compose_cfg([f"method={method}", "++llm.budgets.answer_max_tokens=64"]).answer.max_tokens == 64
