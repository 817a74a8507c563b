"""The listed deviations of a port from the official pipeline it follows, as predicates on a
request-level differential (analysis/differential.py): every difference the differential finds
is either explained by one of them or reported as unexplained.

    from structmem_gpu.analysis.deviations import explain
    ex = explain(differential(RUN_OFFICIAL, RUN_PORT))   # the official run's method picks the list
    ex.unexplained            # [] when every difference is a listed deviation
    ex.stage("consolidate").explained   # {"entry-times": 8}

A deviation explains either

- **messages**: a paired official / port request whose canonical messages (the JSON compared
  for identity) differ, when `messages(official, port)` is true — e.g. equal once every entry
  timestamp's time of day is masked; or
- **settings**: a request setting (`max_tokens`, `response_format`, `seed`, `model`, ...; the
  differential's `params`, which are not part of identity) whose values differ between the two
  runs in a stage.

A request only one run sent is never explained (the runs sent different numbers of requests in
that stage). Each deviation names where it is listed for users (README or docs/methods.md); a
new difference with no deviation to explain it is unexplained, and the pair's test fails
(tests/systems/test_lightmem_official_differential.py). The lists are per official method:
`lightmem_official` against `experiment=structmem_locomo_reference_code`. `seem_skill` has
none: our `seem` follows the paper, not the released skill, and its differences are
documented, not explained request by request (docs/methods.md "seem_skill vs our seem").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from structmem_gpu.analysis.differential import Differential, StageDiff

MessagesPredicate = Callable[[str, str], bool]


@dataclass(frozen=True)
class Deviation:
    name: str
    stages: tuple[str, ...]  # the stages it can explain a difference in
    listed: str  # where users read it (README / docs section)
    settings: tuple[str, ...] = ()  # request settings whose differing values it explains
    messages: MessagesPredicate | None = None  # explains a pair of differing canonical messages


# An ISO timestamp as LightMem writes entry times (`isoformat(timespec='milliseconds')`).
_ISO_MS = re.compile(r"(\d{4}-\d\d-\d\d)T\d\d:\d\d:\d\d\.\d{3}")


def _same_but_times_of_day(official: str, port: str) -> bool:
    """Equal once every entry timestamp keeps only its date: our entries carry their session's
    time, LightMem's their message's (session time + an offset per turn of the batch)."""
    def mask(s: str) -> str:
        return _ISO_MS.sub(r"\1T<time>", s)

    return mask(official) == mask(port)


_README_DEV = "docs/replication.md \"Replicating the papers\", remaining deviations"
LIGHTMEM_OFFICIAL = (
    Deviation("model-name", stages=("extract", "consolidate", "update", "answer", "judge"),
              listed="systems/front.py: the front forwards a system's chat to the job's model, "
              "whatever model name the system sends", settings=("model",)),
    Deviation("request-seed", stages=("extract", "consolidate", "update", "answer", "judge"),
              listed=f"{_README_DEV} (llm.request_seed: our requests carry a seed, LightMem's none)",
              settings=("seed",)),
    Deviation("reply-budgets", stages=("extract", "consolidate", "update", "answer"),
              listed=f"{_README_DEV}: reply budgets (extraction 4,096, synthesis 1,024, update 512, "
              "reader 512 tokens; LightMem asks 16,000 and sets no reader cap)",
              settings=("max_tokens",)),
    Deviation("strict-schema", stages=("extract", "update"),
              listed=f"{_README_DEV}: schema-constrained JSON (LightMem: JSON mode)",
              settings=("response_format",)),
    Deviation("entry-times", stages=("consolidate",),
              listed="docs/methods.md \"StructMem: reference code\", Timestamps (our entries carry "
              "their session's time)", messages=_same_but_times_of_day),
)

# official method name -> its port's listed deviations
DEVIATIONS: Mapping[str, tuple[Deviation, ...]] = {"lightmem_official": LIGHTMEM_OFFICIAL}


@dataclass
class StageExplanation:
    stage: str
    identical: int
    explained: Counter[str] = field(default_factory=Counter)  # deviation -> requests / settings
    unexplained: list[str] = field(default_factory=list)  # one line each


@dataclass
class Explanation:
    method: str | None
    deviations: tuple[Deviation, ...]
    stages: list[StageExplanation]

    @property
    def unexplained(self) -> list[str]:
        return [f"{s.stage}: {u}" for s in self.stages for u in s.unexplained]

    def stage(self, name: str) -> StageExplanation:
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(f"no stage {name!r} (stages: {[s.stage for s in self.stages]})")


def _settings(params: Counter[str]) -> dict[str, set[str]]:
    """key -> the values it took in a stage's requests (params are "k=v" separated by spaces;
    a key some requests lack takes the value "<unset>" there)."""
    rows = [dict(p.split("=", 1) for p in text.split() if "=" in p) for text in params]
    keys = {k for r in rows for k in r}
    return {k: {r.get(k, "<unset>") for r in rows} for k in keys}


def _explain_stage(s: StageDiff, deviations: Sequence[Deviation]) -> StageExplanation:
    out = StageExplanation(s.stage, s.identical)
    mine = [d for d in deviations if s.stage in d.stages]
    for p in s.pairs:
        assert p.official is not None and p.port is not None
        hit = next((d for d in mine if d.messages is not None and p.official.canon is not None
                    and p.port.canon is not None and d.messages(p.official.canon, p.port.canon)),
                   None)
        if hit is None:
            out.unexplained.append(f"{p.official.request_id} <> {p.port.request_id}: messages "
                                   f"differ (similarity {p.ratio:.3f})")
        else:
            out.explained[hit.name] += 1
    for r in s.unmatched_official:
        out.unexplained.append(f"{r.request_id}: sent by the official run only")
    for r in s.unmatched_port:
        out.unexplained.append(f"{r.request_id}: sent by the port only")
    for r in (*s.official_unknown, *s.port_unknown):
        out.unexplained.append(f"{r.request_id}: content not in the response cache")
    a, b = _settings(s.official_params), _settings(s.port_params)
    if s.official and s.port:  # a stage one run lacks has no settings to compare
        for key in sorted(set(a) | set(b)):
            if a.get(key, {"<unset>"}) == b.get(key, {"<unset>"}):
                continue
            hit = next((d for d in mine if key in d.settings), None)
            if hit is None:
                out.unexplained.append(f"setting {key}: official {sorted(a.get(key, {'<unset>'}))}"
                                       f" vs port {sorted(b.get(key, {'<unset>'}))}")
            else:
                out.explained[hit.name] += 1
    return out


def official_method(d: Differential) -> str | None:
    """The official run's method name (its manifest's `method`), None without one."""
    from structmem_gpu.core.artifacts import RunDir

    name = RunDir(d.official).load_manifest().get("method")
    return None if name is None else str(name)


def explain(d: Differential, deviations: Sequence[Deviation] | None = None) -> Explanation:
    """Every difference of `d` explained by a listed deviation or reported (module docstring);
    `deviations` None = the official run's method's list (DEVIATIONS; none = all unexplained)."""
    method = official_method(d) if deviations is None else None
    devs = tuple(DEVIATIONS.get(method or "", ()) if deviations is None else deviations)
    return Explanation(method, devs, [_explain_stage(s, devs) for s in d.stages])
