"""Which configuration keys can change a result, for the run directory's name and the "changed
keys" log: read from the fields' roles (config/settings.py): role "run" fields of JobSettings,
LLMSettings and EmbedderSettings, which the config hash and every stage fingerprint leave out
too, and the fields marked tables=False.

Where a run lives, how it is launched and how fast its requests go never change what it
computes, so none of these keys enters a fingerprint, the config hash or a run directory name:

    launch_key("paths.output_dir")   -> True     launch_key("consolidate.seed_k") -> False
    launch_key("judge.llm.base_url") -> True     (serving knobs of any llm config)
"""

from __future__ import annotations

from structmem_gpu.config.schema import SKIPPED_TOP_KEYS, EmbedderSettings, JobSettings, LLMSettings
from structmem_gpu.config.settings import RUN, fields_with_role, no_table_keys


def _unhashed(model: type) -> tuple[str, ...]:
    return fields_with_role(model, RUN)


# Shards of one job compute parts of one result: one config hash, but their own directories.
SHARD_KEYS = ("shard_index", "num_shards")
# Top-level nodes that say where and how a job runs (README "Running jobs"): the typed fields
# marked hashed=False in config.schema.JobSettings, and Hydra's own node.
LAUNCH_TOP_KEYS = (*SKIPPED_TOP_KEYS, *(k for k in _unhashed(JobSettings) if k not in SHARD_KEYS))
# Serving knobs of an llm config (the job's, a judge's, a panel member's): same replies
# (the hashed=False fields of config.schema.LLMSettings).
SERVING_KEYS = _unhashed(LLMSettings)
# The same for the encoder: its GPU memory plan size (embedder.weights_gb).
ENCODER_PLAN_KEYS = _unhashed(EmbedderSettings)
# Keys that change no table of a run directory but only what is kept beside them: caches
# (replies and embeddings are the same either way) and report figures (tables=False fields).
NO_TABLE_KEYS = no_table_keys(JobSettings)


def _head(key: str) -> str:
    return key.lstrip("+~").split(".", 1)[0]


def launch_key(key: str) -> bool:
    """True for a dotted key (or override key, `+`/`~` prefixes allowed) that cannot change a
    result: launch settings and serving knobs of any llm config."""
    key = key.lstrip("+~")
    if _head(key) in LAUNCH_TOP_KEYS:
        return True
    parts = key.split(".")
    in_llm = parts[0] == "llm" or (parts[0] == "judge" and len(parts) > 2)
    if parts[0] == "embedder" and len(parts) == 2:
        return parts[1] in ENCODER_PLAN_KEYS
    return in_llm and parts[-1] in SERVING_KEYS


def no_table_key(key: str) -> bool:
    """True for keys whose change leaves every table as it was (caches, report figures)."""
    key = key.lstrip("+~")
    return any(key == k or key.startswith(k + ".") for k in NO_TABLE_KEYS)


def changes_result(key: str) -> bool:
    """True for a key whose value can change a table of the run (not a launch key, a serving
    knob, a cache switch or report figures): what names run directories and comparisons."""
    return not (launch_key(key) or no_table_key(key))


def split_override(override: str) -> tuple[str, str | None]:
    """Hydra override text -> (key without `+`/`++`, value; None for `~key` deletions)."""
    key, sep, value = str(override).partition("=")
    return key.lstrip("+"), (value if sep else None)
