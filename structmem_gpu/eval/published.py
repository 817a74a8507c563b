"""Published figures (StructMem, SEEM) as data, matched to a run's configuration.

The numbers live in `eval/published/*.json`, each row with its source (paper, table/figure,
row) and a `match` block of config values that make a run comparable, e.g.

    {"id": "structmem-fig3d-k10", "source": "StructMem paper, Figure 3d (seed K sweep), K = 10",
     "match": {"benchmark": "locomo", "method": "structmem", "consolidate.seed_k": 10},
     "judge_model": "gpt-4o-mini", "categories": [1, 2, 3, 4],
     "overall": {"judge_accuracy": 76.49}, "by_category": {}}

`match` keys: "benchmark" (= benchmark.name), "method" (= method.name), or any dotted config
key; a row lists EVERY setting the published figure fixes (method, benchmark, ablation
switches, seed_k, p_ret_k, rpe_factor, fusion window, passages per request, entries/syntheses
per question, reader protocol, ...), and `match` is the configuration that PRODUCED the
number: for StructMem the released code's (docs/evaluation.md "Evaluation protocols" says which run
matches which row), i.e. its pipeline (every stage of
experiment=structmem_locomo_reference_code, compress and segment included, see `method.stages`
below; `extract.input: segments`, extraction from the segment stage's batches of compressed
text; `extract.reference_mode: event`; the offline update on, `update.enabled: true`, with
`update.read` unpinned: pre and post are both readings of the code), its seed pool
(`consolidate.seed_scope: global`, `consolidate.seed_exclude_buffer: false`), its encoder
(`embedder.model`: all-MiniLM-L6-v2, which `embedder.model: null` is, `embedder.long_texts:
truncate`) and what its judge saw (`judge.input: reply`; absent = that default). Table 2's
flat and w/o cross-event rows fix the same build (compress, segment, segments input; the flat
row `extract.reference_mode: flat`, experiment=flat_locomo_reference_code) and no update (the
paper does not say whether they ran it). SEEM's paper names no encoder and its code is not
public, so its rows pin neither.

Every key compares by equality except `method.stages`, whose value is the list of stages the
configuration requires: a run matches when its `method.stages` lists every one of them (more
are allowed, e.g. audits; order is the method's, not compared). A row requiring
`[load, compress, segment, extract, ...]` is thus never matched by a pipeline without the
compression or segmentation stage. The job's root `stages` (the part of the pipeline one job
reruns, e.g. `stages=[judge,report]` to re-judge a run directory) is not consulted.

A row may also be shown beside other configurations, each with a note saying so:

    "beside": [{"note": "paper text configuration, number from the code's",
                "differs": {"consolidate.seed_scope": "historical", "extract.input": "turns",
                            "method.stages": [load, extract, embed, consolidate, ...], ...},
                "unpinned": ["embedder.model", "update.enabled"]}]

is `match` with `differs` applied and the `unpinned` keys dropped (any value matches: the
paper's text-embedding-3-small is an API model, any encoder stands in for it; the paper text
has no update stage, so its switch is moot). A run that matches `match` itself gets no note.
On top of its `match` block a row matches only when

- the run's category scope (`benchmark.categories`; null = every category of the benchmark)
  equals the row's `categories`;
- the run's `judge.protocol` is `paper` (the published judges);
- the run is not a harness run: never for `llm=scripted` (llm.backend scripted) or a debug
  profile (`debug_profile` set by debug=ci / debug=scripted).

`match: null` rows are data only and never matched; each carries `excluded`, the reason no
configuration here reproduces it (a system that needs a hosted server, a setting not
implemented, or a duplicate: "the same figures as ROW", naming the row a run matches), and a
row with a `match` carries none, so every row on file is either matched or excluded with its
reason (the loader refuses anything else). Values are percentages, as printed in the papers.

Other keys are extra data, kept in `PublishedRow.extra` (a `note`, `correct_by_category`,
`backbone`, ...). StructMem Table 1's build cost, for all 10 conversations, where the paper
prints it (absent where it prints "-"):

    "build_cost": {"prompt_tokens": 1501000, "completion_tokens": 436000,
                   "total_tokens": 1937000, "calls": 1056, "wall_s": 22854}

tokens as printed in millions with three decimals, times 10^6 (the printed sum is its own
figure: the paper rounds it apart from the two parts), calls and wall-clock seconds as printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from structmem_gpu.config.job import JobConfig
from structmem_gpu.data.categories import LOCOMO_CATEGORIES, LONGMEMEVAL_TYPES

PUBLISHED_DIR = Path(__file__).resolve().parent / "published"
_ALIASES = {"benchmark": "benchmark.name", "method": "method.name"}


@dataclass(frozen=True)
class Beside:
    """Another configuration a row is shown beside, with the note it is shown with."""

    note: str
    match: Mapping[str, Any]  # the row's match with `differs` applied, `unpinned` dropped


@dataclass(frozen=True)
class PublishedRow:
    id: str
    paper: str
    source: str
    label: str
    match: Mapping[str, Any] | None
    judge_model: str
    categories: tuple[int, ...]  # the categories the row's overall figures cover
    overall: Mapping[str, float]  # metric -> percent
    by_category: Mapping[str, Mapping[str, float]]  # metric -> category id (str) -> percent
    extra: Mapping[str, Any] = field(default_factory=dict)  # build_cost, correct_by_category, ...
    beside: tuple[Beside, ...] = ()
    excluded: str | None = None  # why no configuration matches the row (match is None)


_KNOWN = {"id", "source", "label", "match", "judge_model", "categories", "overall", "by_category"}
_OPTIONAL = {"beside", "excluded"}
# Keys whose value is a list the run's value must include every item of (module docstring).
_INCLUDES = frozenset({"method.stages"})


def _check_values(match: Mapping[str, Any], where: str) -> None:
    for key in _INCLUDES & set(match):
        value = match[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: {key} must be a list of names (the stages the "
                             f"configuration requires), not {value!r}")


def _beside(raw: Mapping[str, Any], match: Mapping[str, Any] | None, origin: Path) -> Beside:
    differs, unpinned = dict(raw.get("differs") or {}), list(raw.get("unpinned") or [])
    unknown = (set(differs) | set(unpinned)) - set(match or {})
    if not match or not raw.get("note") or unknown:
        raise ValueError(f"{origin}: a 'beside' entry needs a note and keys of the row's match "
                         f"(unknown: {sorted(unknown)})")
    merged = {k: differs.get(k, v) for k, v in match.items() if k not in unpinned}
    _check_values(merged, f"{origin}: 'beside' entry {raw['note']!r}")
    return Beside(note=str(raw["note"]), match=merged)


def _row(paper: str, raw: Mapping[str, Any], origin: Path) -> PublishedRow:
    missing = _KNOWN - set(raw)
    if missing:
        raise ValueError(f"{origin}: row {raw.get('id')!r} lacks {sorted(missing)}")
    _check_values(raw["match"] or {}, f"{origin}: row {raw['id']!r}")
    excluded = raw.get("excluded")
    if (raw["match"] is None) != bool(excluded) or not isinstance(excluded, (str, type(None))):
        raise ValueError(
            f"{origin}: row {raw['id']!r}: a row without a match needs 'excluded' (the reason, "
            "a string) and a row with a match has none; it has "
            f"match={'null' if raw['match'] is None else '{...}'}, excluded={excluded!r}")
    return PublishedRow(
        id=str(raw["id"]),
        paper=paper,
        source=str(raw["source"]),
        label=str(raw["label"]),
        match=raw["match"],
        judge_model=str(raw["judge_model"]),
        categories=tuple(int(c) for c in raw["categories"]),
        overall={k: float(v) for k, v in (raw["overall"] or {}).items()},
        by_category={
            m: {c: float(v) for c, v in cats.items()}
            for m, cats in (raw["by_category"] or {}).items()
        },
        extra={k: v for k, v in raw.items() if k not in _KNOWN | _OPTIONAL},
        beside=tuple(_beside(b, raw["match"], origin) for b in raw.get("beside") or ()),
        excluded=str(excluded) if excluded else None,
    )


@lru_cache(maxsize=1)
def load_published(directory: Path = PUBLISHED_DIR) -> tuple[PublishedRow, ...]:
    rows: list[PublishedRow] = []
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows.extend(_row(str(doc["paper"]), raw, path) for raw in doc["rows"])
    ids = [r.id for r in rows]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate published row ids in {directory}")
    return tuple(rows)


# What a null (or absent) value of a match key means, so that rows name the thing itself:
# `embedder.model: null` is the packaged all-MiniLM-L6-v2 (conf/embedder/minilm.yaml), and a
# config without `judge.input` judges the reader's whole reply (the paper-protocol default).
PACKAGED_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
_NULL_MEANS = {"embedder.model": PACKAGED_ENCODER, "judge.input": "reply"}


def config_fact(cfg: JobConfig | DictConfig, key: str) -> Any:
    """The value a match key names: of the job's configuration (a JobConfig: plain values, as
    the match rows hold them), or of a finished run's saved config (.hydra/config.yaml, read
    with OmegaConf here, the one reader of saved configs outside config/)."""
    dotted = _ALIASES.get(key, key)
    if isinstance(cfg, JobConfig):
        value = cfg.select(dotted)
    else:
        value = OmegaConf.select(cfg, dotted, default=None)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
    return _NULL_MEANS.get(key) if value is None else value


# The job's configuration, a saved config, or a dotted key -> value lookup.
Facts = JobConfig | DictConfig | Callable[[str], Any]


def _lookup(facts: Facts) -> Callable[[str], Any]:
    if isinstance(facts, (JobConfig, DictConfig)):
        return lambda key: config_fact(facts, key)

    def get(key: str) -> Any:
        value = facts(key)
        return _NULL_MEANS.get(key) if value is None else value

    return get


def run_categories(facts: Facts) -> tuple[int, ...]:
    """The run's category scope: benchmark.categories, or every category of its benchmark."""
    get = _lookup(facts)
    cats = get("benchmark.categories")
    if cats is not None:
        scope = tuple(sorted(int(c) for c in cats))
    elif get("benchmark") == "longmemeval":
        return tuple(sorted(LONGMEMEVAL_TYPES.values()))
    else:
        scope = tuple(sorted(LOCOMO_CATEGORIES))
    # eval.cat5=forced_choice scores category 5 apart (eval/cat5_choice.py): the overall a
    # published row is compared with covers the other categories only.
    if get("eval.cat5") == "forced_choice":
        scope = tuple(c for c in scope if c != 5)
    return scope


def _harness_backend(name: Any) -> bool:
    """Whether backend `name` says its replies are scripted (Backend.harness); a backend no
    longer registered is judged by its own run's other facts."""
    from structmem_gpu.llm.backends import backend

    try:
        return backend(str(name)).harness
    except ValueError:
        return False


def harness_run(facts: Facts) -> str | None:
    """Why a run can never be compared with a paper (None = it can)."""
    get = _lookup(facts)
    if _harness_backend(get("llm.backend")):
        return f"llm={get('llm.backend')} (scripted replies, not a model)"
    profile = get("debug_profile")
    if profile:
        return f"debug={profile} (shrunk settings)"
    return None


def match_note(facts: Facts, row: PublishedRow) -> str | None:
    """How the run matches `row`: None = not at all; "" = it is the configuration that
    produced the number; else the note of the `beside` configuration it is (module docstring)."""
    get = _lookup(facts)
    if not row.match or harness_run(get) is not None:
        return None
    if (get("judge.protocol") or "paper") != "paper":
        return None
    if run_categories(get) != tuple(sorted(row.categories)):
        return None
    for note, match in (("", row.match), *((b.note, b.match) for b in row.beside)):
        if all(meets(k, get(k), v) for k, v in match.items()):
            return note
    return None


def meets(key: str, have: Any, want: Any) -> bool:
    """Whether the run's value `have` of match key `key` meets the row's `want`: equal, or for
    an `_INCLUDES` key (method.stages) a list holding every item of `want`."""
    if key in _INCLUDES:
        return isinstance(have, (list, tuple)) and set(want) <= set(have)
    return have == want


def row_matches(facts: Facts, row: PublishedRow) -> bool:
    """True when the run reproduces every setting `row` fixes, or is one of the
    configurations the row is shown beside (see the module docstring)."""
    return match_note(facts, row) is not None


def matching_rows(
    cfg: JobConfig | DictConfig, rows: Sequence[PublishedRow] | None = None
) -> list[PublishedRow]:
    """Rows that `row_matches` the run."""
    return [r for r in (load_published() if rows is None else rows) if row_matches(cfg, r)]


def match_notes(facts: Facts, rows: Sequence[PublishedRow] | None = None) -> dict[str, str]:
    """row id -> note, for the matching rows shown with one (report.json `published_notes`)."""
    rows = load_published() if rows is None else rows
    return {r.id: note for r in rows if (note := match_note(facts, r))}


def shown_label(row: PublishedRow, notes: Mapping[str, str] | None) -> str:
    """The row's label as a report shows it: with its note when the run matched one."""
    note = (notes or {}).get(row.id)
    return f"{row.label} ({note})" if note else row.label


def comparison_lines(cfg: JobConfig | DictConfig, rows: Sequence[PublishedRow] | None = None) -> list[str]:
    """What the dry run prints first: the published rows the run's report will be compared
    with, each with its source and, for a `beside` configuration, its note; or why none."""
    matched = matching_rows(cfg, rows)
    if not matched:
        why = harness_run(cfg)
        return ["published rows compared: none for this configuration"
                + (f" (harness run: {why})" if why else "")]
    notes = match_notes(cfg, rows)
    return [f"published rows compared ({len(matched)}):"] + [
        f"  {r.id}: {shown_label(r, notes)} ({r.source}; judge {r.judge_model})" for r in matched
    ]


# ---- a finished run's saved configuration (.hydra/*.yaml) ------------------------------------
# Hydra saves a job's config unresolved (interpolations and resolvers as written). These are the
# readers of those files for the analysis and merge code, which otherwise never touch OmegaConf.


def saved_yaml(path: Path) -> Any:
    """A saved Hydra file (config.yaml, overrides.yaml) as plain data, interpolations kept as
    their text."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def saved_facts(path: Path) -> Callable[[str], Any]:
    """A saved config.yaml as a match-key lookup (config_fact): a value whose interpolation
    needs the launching job's resolvers reads as "<unresolved: KEY>", which meets no row."""
    from omegaconf.errors import OmegaConfBaseException

    cfg = OmegaConf.load(path)

    def get(key: str) -> Any:
        try:
            return config_fact(cfg, key)
        except OmegaConfBaseException:
            return f"<unresolved: {key}>"

    return get


def saved_value(path: Path, key: str) -> Any:
    """The value at dotted `key` of a saved config, its interpolations resolved (None when the
    key is absent); a key whose resolver belongs to the launching job raises."""
    value = OmegaConf.select(OmegaConf.load(path), key, default=None,
                             throw_on_resolution_failure=True)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def saved_job(path: Path) -> JobConfig:
    """A saved config.yaml as the JobConfig it was run with (every interpolation resolved)."""
    return JobConfig.from_cfg(OmegaConf.load(path))
