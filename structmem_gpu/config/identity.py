"""One identity: what of a settings object can change a result, read from its fields' roles.

    identity(job.root.llm)                       # every field of role result, model or reply
    identity(llm, roles=(REPLY,), changed=True)  # the reply knobs away from their defaults

A field's role (config/settings.py) is the one answer to "does this key change a result?":
"model" identifies a model, "reply" changes the reply one request gets, "result" changes
results some other way, "run" only where or how a job runs. Every key derived from a
configuration is this function over the typed settings, never a list of names:

- a stage's fingerprint (run/pipeline.stage_config): its settings, and the nodes it depends on
  (the answer LLM "llm", the encoder "embedder");
- the config hash (run/pipeline.config_hash): the job's root nodes and every stage's settings;
- the response-cache key (llm/factory.cache_params): the reply knobs not at their default, so a
  cache written before a reply knob existed (or while it kept its default) stays valid;
- the judge identity (eval/judge.judge_identity): the judge's settings and the answer LLM.

A knob added to a model is therefore in every key its role calls for, with no other file
touched (tests/unit/test_identity.py). Run-directory keys read the same roles per dotted key
(config/result_keys.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from structmem_gpu.config.settings import MODEL, REPLY, RESULT, Settings, fields, open_values, role

# The roles that change a result: what fingerprints and the config hash read.
HASHED_ROLES = (RESULT, MODEL, REPLY)
# Bump when what identity() returns changes shape: every stage fingerprint changes once, and
# finished stages rerun (their LLM requests come from the response cache, whose keys this
# version does not enter).
FINGERPRINT_VERSION = "2"


def identity(obj: Any, roles: Iterable[str] = HASHED_ROLES, *, changed: bool = False) -> Any:
    """`obj`'s fields whose role is in `roles`, as plain JSON data (nested settings as mappings,
    tuples as lists, the open keys' values too). changed=True keeps only the fields whose value
    differs from the field's default (nested settings: their changed fields, when any)."""
    roles = tuple(roles)
    if isinstance(obj, Settings):
        out: dict[str, Any] = {}
        for name, f in fields(type(obj)).items():
            if role(f) not in roles:
                continue
            value = getattr(obj, name)
            if changed and value == f.default:
                continue
            out[name] = identity(value, roles, changed=changed)
        out.update({k: identity(v, roles, changed=changed) for k, v in open_values(obj).items()})
        return out
    if isinstance(obj, (list, tuple)):
        return [identity(v, roles, changed=changed) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): identity(v, roles, changed=changed) for k, v in obj.items()}
    return obj


def reply_params(obj: Settings) -> dict[str, Any]:
    """The reply knobs (role "reply") of llm settings away from their defaults: what the
    response-cache key adds to the model and the request (llm.request_seed=false ...)."""
    out = identity(obj, (REPLY,), changed=True)
    assert isinstance(out, dict)
    return out
