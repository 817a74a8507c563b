"""Request-level differential of two runs: where an official pipeline and our port part.

    from structmem_gpu.analysis.differential import differential
    d = differential("outputs/runs/locomo/lightmem_official", "outputs/runs/locomo/structmem_ref")
    d.stage("extract").share, d.stage("extract").pairs, d.questions

(`python jobs/report.py differential RUN_OFFICIAL RUN_PORT` writes it: differential_report.py.)

Each run's requests.parquet rows are read back from the response caches
(differential_sources.py) and grouped by stage: our stages by their stage column, a system's
rows (the official pipeline run through the recording front) by the phase of their request_id
("build.extract" -> extract). Stages are the union of both runs', in the order of the runs'
`method.stages` (the port's first), then any other alphabetically.

**Identical** means byte-equal canonical messages: the JSON of [{role, content}] in order
(content as sent; a list of content parts as its sorted-key JSON). Not part of it, and listed
separately per stage (`params`): the model name, the sampling parameters (temperature,
max_tokens, top_p, seed), the requested output format (response_format / a JSON schema),
tools, and message fields other than role and content. So a request can be identical while
its reply budget differs: the params column shows that. Identity is a multiset intersection:
a message list sent twice by one run and once by the other counts once.

Per stage: requests (chat / LLM calls; embedding calls counted apart and compared by their
input strings where the cache holds them), identical, share = identical / max(official, port)
(1.0 only when both sent the same multiset), requests whose content the cache does not hold
(`*_unknown`: never identical, never paired), and the rest paired: each unmatched official
request, in recorded order, with the most similar unmatched port request (difflib ratio over
the rendered lines; the same conversation's first when it has any). The first pair is the
stage's first difference, shown as a unified diff (official -> port), cut at
DIFF_LINES lines of at most LINE_CHARS characters (how much was cut is said).
"""

from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from structmem_gpu.analysis.differential_sources import (
    Recorded,
    Stores,
    cache_dir_of,
    read_requests,
)
from structmem_gpu.core.errors import StructMemError

DIFF_LINES = 80  # diff lines shown for a stage's first difference
LINE_CHARS = 400  # characters shown of one diff line (prompts can hold whole sessions on a line)
FULL_RATIOS = 8  # candidates (best quick_ratio first) whose full difflib ratio is computed
DEFAULT_K = 10


@dataclass(frozen=True)
class Pair:
    """An official request and the port request most like it (either may be missing)."""

    official: Recorded | None
    port: Recorded | None
    ratio: float  # difflib ratio of their rendered lines (0 when one side is missing)


@dataclass(frozen=True)
class FirstDifference:
    pair: Pair
    diff: str  # unified diff official -> port, cut as the module docstring says
    cut_lines: int  # diff lines not shown
    total_lines: int


@dataclass
class StageDiff:
    stage: str
    official: int  # chat / LLM requests
    port: int
    identical: int
    official_unknown: list[Recorded] = field(default_factory=list)  # content not in the cache
    port_unknown: list[Recorded] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)  # both sides present, not identical
    unmatched_official: list[Recorded] = field(default_factory=list)  # no port request left
    unmatched_port: list[Recorded] = field(default_factory=list)
    first: FirstDifference | None = None
    official_embeddings: int = 0
    port_embeddings: int = 0
    embeddings_identical: int | None = None  # None: no embedding inputs stored on either side
    official_params: Counter[str] = field(default_factory=Counter)
    port_params: Counter[str] = field(default_factory=Counter)

    @property
    def share(self) -> float | None:
        n = max(self.official, self.port)
        return self.identical / n if n else None

    @property
    def differing(self) -> list[tuple[str, str]]:
        """(official messages_hash, port messages_hash) of every paired difference."""
        return [(p.official.messages_hash, p.port.messages_hash) for p in self.pairs
                if p.official is not None and p.port is not None]


@dataclass
class Differential:
    official: Path
    port: Path
    k: int
    stages: list[StageDiff]
    memory: pl.DataFrame  # per conversation: the official memories, the port's entries, ...
    questions: pl.DataFrame  # per (question, official circuit, port circuit): overlap@k
    cache_dirs: tuple[Path, Path]

    def stage(self, name: str) -> StageDiff:
        for s in self.stages:
            if s.stage == name:
                return s
        names = [s.stage for s in self.stages]
        raise KeyError(f"no stage {name!r} in either run (stages: {names})")


def _similar(target: Recorded, pool: list[Recorded]) -> tuple[int, float]:
    """(index in pool, ratio) of the request most like `target`: the same conversation's
    requests when there are any; quick_ratio ranks, the full ratio decides among the best."""
    same = [i for i, r in enumerate(pool) if r.conv_id == target.conv_id]
    idx = same or list(range(len(pool)))
    sm = difflib.SequenceMatcher(None, autojunk=False)
    sm.set_seq2((target.text or "").splitlines())  # fixed side: its counts are built once
    quick = []
    for i in idx:
        sm.set_seq1((pool[i].text or "").splitlines())
        quick.append((-sm.quick_ratio(), i))
    best, best_ratio = idx[0], -1.0
    for _q, i in sorted(quick)[:FULL_RATIOS]:
        sm.set_seq1((pool[i].text or "").splitlines())
        ratio = sm.ratio()
        if ratio > best_ratio or (ratio == best_ratio and i < best):
            best, best_ratio = i, ratio
    return best, max(best_ratio, 0.0)


def _cut(line: str) -> str:
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]}… [+{len(line) - LINE_CHARS} chars]"


def first_difference(pair: Pair) -> FirstDifference:
    a, b = pair.official, pair.port
    lines = list(difflib.unified_diff(
        (a.text or "").splitlines() if a else [], (b.text or "").splitlines() if b else [],
        fromfile=f"official {a.request_id}" if a else "official (none)",
        tofile=f"port {b.request_id}" if b else "port (none)", lineterm="", n=2))
    shown = [_cut(x) for x in lines[:DIFF_LINES]]
    return FirstDifference(pair, "\n".join(shown), len(lines) - len(shown), len(lines))


def _embeddings_identical(off: list[Recorded], port: list[Recorded]) -> int | None:
    if not any(r.canon for r in off) and not any(r.canon for r in port):
        return None
    a = Counter(r.canon for r in off if r.canon)
    b = Counter(r.canon for r in port if r.canon)
    return sum((a & b).values())


def align_stage(stage: str, official: Sequence[Recorded], port: Sequence[Recorded]) -> StageDiff:
    """One stage's alignment (the module docstring says what each number means)."""
    off_chat = [r for r in official if not r.embedding]
    port_chat = [r for r in port if not r.embedding]
    out = StageDiff(stage, len(off_chat), len(port_chat), 0,
                    official_unknown=[r for r in off_chat if r.canon is None],
                    port_unknown=[r for r in port_chat if r.canon is None],
                    official_embeddings=sum(r.embedding for r in official),
                    port_embeddings=sum(r.embedding for r in port),
                    embeddings_identical=_embeddings_identical(
                        [r for r in official if r.embedding], [r for r in port if r.embedding]),
                    # settings of the requests the cache holds (an unknown one's are unknown)
                    official_params=Counter(r.params for r in off_chat if r.canon is not None),
                    port_params=Counter(r.params for r in port_chat if r.canon is not None))
    left: dict[str, int] = Counter(r.canon for r in port_chat if r.canon is not None)
    rest_off = []
    for r in off_chat:  # the earliest copies match; later ones are the surplus
        if r.canon is None:
            continue
        if left.get(r.canon, 0) > 0:
            left[r.canon] -= 1
            out.identical += 1
        else:
            rest_off.append(r)
    taken: dict[str, int] = defaultdict(int)  # port copies matched, per canon
    matched = Counter(r.canon for r in off_chat if r.canon is not None) & Counter(
        r.canon for r in port_chat if r.canon is not None)
    rest_port = []
    for r in port_chat:
        if r.canon is None:
            continue
        if taken[r.canon] < matched.get(r.canon, 0):
            taken[r.canon] += 1
        else:
            rest_port.append(r)
    for r in rest_off:
        if not rest_port:
            out.unmatched_official.append(r)
            continue
        i, ratio = _similar(r, rest_port)
        out.pairs.append(Pair(r, rest_port.pop(i), ratio))
    out.unmatched_port = rest_port
    if out.pairs:
        out.first = first_difference(out.pairs[0])
    elif out.unmatched_official or out.unmatched_port:
        lone = Pair(out.unmatched_official[0], None, 0.0) if out.unmatched_official else \
            Pair(None, out.unmatched_port[0], 0.0)
        out.first = first_difference(lone)
    return out


def stage_order(names: set[str], *runs: Path) -> list[str]:
    """`names` in the runs' `method.stages` order (the first run's first), then the rest
    alphabetically (a run without a saved config contributes no order)."""
    from structmem_gpu.stage_lookup import RunStages

    order: list[str] = []
    for run in runs:
        order += [s for s in RunStages(run).order if s not in order]
    rank = {s: i for i, s in enumerate(order)}
    return sorted(names, key=lambda s: (0, rank[s], "") if s in rank else (1, 0, s))


def differential(official: str | Path, port: str | Path, cache_dir: str | Path | None = None,
                 k: int | None = None) -> Differential:
    """Align `official`'s recorded requests with `port`'s, stage by stage, and compare their
    memories and top-`k` retrievals (None: DEFAULT_K). `cache_dir` (the runs'
    paths.cache_dir) overrides each run's own (read from its .hydra/config.yaml)."""
    from structmem_gpu.analysis.differential_memory import memory_sizes, retrieval_overlap

    k = DEFAULT_K if k is None else k
    if k < 1:
        raise StructMemError(f"--k {k}: retrieved items compared per question must be >= 1")
    official, port = Path(official), Path(port)
    dirs = tuple(Path(cache_dir) if cache_dir is not None else cache_dir_of(r)
                 for r in (official, port))
    stores = {d: Stores(d) for d in set(dirs)}
    try:
        rows_off = read_requests(official, stores[dirs[0]])
        rows_port = read_requests(port, stores[dirs[1]])
    finally:
        for s in stores.values():
            s.close()
    by_off: dict[str, list[Recorded]] = defaultdict(list)
    by_port: dict[str, list[Recorded]] = defaultdict(list)
    for r in rows_off:
        by_off[r.stage].append(r)
    for r in rows_port:
        by_port[r.stage].append(r)
    names = stage_order(set(by_off) | set(by_port), port, official)
    stages = [align_stage(s, by_off.get(s, []), by_port.get(s, [])) for s in names]
    return Differential(official, port, k, stages, memory_sizes(official, port),
                        retrieval_overlap(official, port, k), (dirs[0], dirs[1]))
