"""Which configuration keys can change a result, for the run directory's name and the "changed
keys" log: a dotted key's role, read from the field that declares it (config/settings.py), as
every other identity reads it (config/identity.py).

Where a run lives, how it is launched and how fast its requests go never change what it
computes, so none of these keys enters a fingerprint, the config hash or a run directory name:

    launch_key("paths.output_dir")   -> True     launch_key("consolidate.seed_k") -> False
    launch_key("judge.llm.base_url") -> True     (role "run" fields of any llm config)
"""

from __future__ import annotations

from typing import Any

from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import SKIPPED_TOP_KEYS, EmbedderSettings, JobSettings, LLMSettings
from structmem_gpu.config.settings import (
    RESULT,
    RUN,
    Settings,
    fields,
    fields_with_role,
    item_model,
    no_table_keys,
    open_key_spec,
    role,
    sub_model,
    tables,
)

# Shards of one job compute parts of one result: one config hash, but their own directories.
SHARD_KEYS = ("shard_index", "num_shards")
# The models that declare the config root's nodes: JobSettings' own, and the judge's node
# (a stage's settings that config/ owns, since its llm configs are LLMSettings).
ROOTS: dict[str, type[Settings]] = {"judge": JudgeSettings}

# The key lists below are derived from the roles (tests and docs show them; the functions
# read the roles themselves).
# Top-level nodes that say where and how a job runs (docs/getting-started.md "Running jobs"): JobSettings'
# role "run" fields, and Hydra's own node.
LAUNCH_TOP_KEYS = (*SKIPPED_TOP_KEYS, *(k for k in fields_with_role(JobSettings, RUN)
                                        if k not in SHARD_KEYS))
# Serving knobs of an llm config (the job's, a judge's, a panel member's): same replies.
SERVING_KEYS = fields_with_role(LLMSettings, RUN)
# The same for the encoder: its GPU memory plan size (embedder.weights_gb).
ENCODER_PLAN_KEYS = fields_with_role(EmbedderSettings, RUN)
# Keys that change no table of a run directory but only what is kept beside them: caches
# (replies and embeddings are the same either way) and report figures (NO_TABLES fields).
NO_TABLE_KEYS = no_table_keys(JobSettings)


def _walk(model: type[Settings], parts: list[str]) -> tuple[str, bool]:
    """(role, changes a table) of the key `parts` under `model`: a role "run" or NO_TABLES
    field on the path decides for everything below it; a key no field declares is a result."""
    head, rest = parts[0], parts[1:]
    f = fields(model).get(head)
    if f is None:
        spec: Any = open_key_spec(model, head)  # judge.qwen_llm: an LLMSettings by pattern
        if isinstance(spec, type) and issubclass(spec, Settings) and rest:
            return _walk(spec, rest)
        return RESULT, True
    if role(f) == RUN or not tables(f) or not rest:
        return role(f), tables(f)
    nested = sub_model(f)
    if nested is None and item_model(f) is not None and rest[0].isdigit():
        nested, rest = item_model(f), rest[1:]  # judge.panel.0.llm.base_url
    return _walk(nested, rest) if nested is not None and rest else (role(f), tables(f))


def key_role(key: str) -> tuple[str, bool]:
    """(role, changes a table) of dotted config `key` (override spelling: `+`/`~` allowed)."""
    parts = key.lstrip("+~").split(".")
    if parts[0] in SKIPPED_TOP_KEYS:
        return RUN, False
    if parts[0] in ROOTS:
        return _walk(ROOTS[parts[0]], parts[1:]) if parts[1:] else (RESULT, True)
    return _walk(JobSettings, parts)


def launch_key(key: str) -> bool:
    """True for a dotted key (or override key, `+`/`~` prefixes allowed) that cannot change a
    result: its field's role is "run" (launch settings, serving knobs of any llm config);
    shard keys change results (each shard's tables differ), hence are not launch keys."""
    key = key.lstrip("+~")
    return key.split(".")[0] not in SHARD_KEYS and key_role(key)[0] == RUN


def no_table_key(key: str) -> bool:
    """True for keys whose change leaves every table as it was (caches, report figures)."""
    return not key_role(key)[1]


def changes_result(key: str) -> bool:
    """True for a key whose value can change a table of the run (not a launch key, a serving
    knob, a cache switch or report figures): what names run directories and comparisons."""
    return not (launch_key(key) or no_table_key(key))


def split_override(override: str) -> tuple[str, str | None]:
    """Hydra override text -> (key without `+`/`++`, value; None for `~key` deletions)."""
    key, sep, value = str(override).partition("=")
    return key.lstrip("+"), (value if sep else None)
