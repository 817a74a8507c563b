"""The judge's own error rates: the configured judge (each member of a panel) on answer sets
whose truth is known.

    python jobs/report.py judge-audit judge=same_as_llm            # CPU: 60 items per set
    python jobs/report.py judge-audit judge=gpt_4o_mini_endpoint eval.judge_audit.per_set=null
    python jobs/run.py stages=[judge_audit,report] hydra.run.dir=RUN  # the run's judges

Answer sets, read at run time from dial481/locomo-audit (eval/locomo_audit.py):

- `v1` (wrong): the audit's specific-but-wrong answers (ap-baseline/v1), 1,540;
- `v2` (wrong): its vague-but-topical answers (ap-baseline/v2), 1,540;
- `gold` (right): each question's gold answer itself;
- `paraphrase` (right): the gold in a carrier sentence ("It was 7 May 2023."; ours, one of
  PARAPHRASES chosen by the question id), a light rewording a lenient judge must accept too.

Each set is judged with the judge stage's own request builder and label rules (eval/judge.py,
`judge.protocol`, the official judge text where configured) through the response cache. A
wrong answer accepted is a false accept; a right answer not accepted (WRONG, or no readable
label: unjudged counts as wrong, as in judge_accuracy) is a false reject. Rates come overall
and per category with Wilson 95% intervals (unit: items).

An audit is stored once per judge identity (the judge's model and reply knobs, protocol and
judge texts, never its name) and slice, under `<paths.cache_dir>/judge_audit/<key>/<slice>/`
(audit.json, audit.md, items.parquet), and reused: every report.md and `compare` table of a
run with that judge shows its rates beside the judge's name, "not audited" otherwise. The
slice (`eval.judge_audit.per_set`, default 60 per set, the same seeded questions in every
set) is what the CPU profile can afford; `per_set=null` judges the full sets (a GPU or an
endpoint), and every view names which.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.config.identity import identity
from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import EvalSettings, JudgeAuditSettings, LLMSettings
from structmem_gpu.core.artifacts import RunDir, atomic_write_parquet, atomic_write_text
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.core.stage_parts import AUDIT
from structmem_gpu.data.categories import LOCOMO_CATEGORIES
from structmem_gpu.eval import judge as J
from structmem_gpu.eval import locomo_audit as LA
from structmem_gpu.eval.bootstrap import wilson_ci
from structmem_gpu.llm.types import LLMBackend, Sampling
from structmem_gpu.prompts import sources as S
from structmem_gpu.stage import (Backends, EstimateInputs, Stage, StageContext, StageEstimate,
                                 judge_members)

log = logging.getLogger(__name__)

# Bump when the sets, the paraphrases or the rates change: every stored audit is redone.
AUDIT_VERSION = "1"
SOURCE_KEY = "eval.judge_audit.source"
WRONG, RIGHT = "wrong", "right"
SETS: Mapping[str, str] = {"v1": WRONG, "v2": WRONG, "gold": RIGHT, "paraphrase": RIGHT}
# Carrier sentences of the paraphrase set (ours): the gold unchanged inside a short sentence.
PARAPHRASES = ("It was {gold}.", "I believe the answer is {gold}.", "{gold}, as far as I know.")


def paraphrase(question_id: str, gold: str) -> str:
    """The gold in one of PARAPHRASES, chosen by the question id (the same on every machine)."""
    carrier = PARAPHRASES[int(stable_hash(question_id), 16) % len(PARAPHRASES)]
    return carrier.format(gold=gold.strip().rstrip("."))


@dataclass(frozen=True)
class AuditItem:
    set: str
    truth: bool  # whether the answer is right (the judge should accept it)
    question: LA.AuditQuestion

    def judge_item(self) -> J.JudgeItem:
        q = self.question
        return J.JudgeItem(
            question_id=f"audit:{self.set}:{q.question_id}", conv_id=f"locomo_{q.conversation}",
            question=q.question, gold=q.gold, category=q.category,
            category_name=LOCOMO_CATEGORIES.get(q.category, str(q.category)),
            is_abstention=False, prediction=q.answer)


def slice_name(per_set: int | None, seed: int, commit: str | None) -> str:
    size = "full" if per_set is None else f"slice{per_set}-seed{seed}"
    return f"{size}-{(commit or 'workdir')[:12]}"


def audit_items(src: S.Source, per_set: int | None, seed: int) -> tuple[list[AuditItem], int]:
    """Every set's items for the same seeded questions (all 1,540 when per_set is None), and
    how many questions the answer key holds."""
    key = LA.answer_key(src)
    ids = [q.question_id for q in key]
    if per_set is not None and per_set < len(ids):
        chosen = set(random.Random(seed).sample(ids, per_set))
        ids = [i for i in ids if i in chosen]  # the answer key's order
    by_set: dict[str, dict[str, LA.AuditQuestion]] = {
        "gold": {q.question_id: q for q in key},
        "paraphrase": {q.question_id: LA.AuditQuestion(
            q.question_id, q.conversation, q.category, q.question, q.gold,
            paraphrase(q.question_id, q.gold)) for q in key},
    }
    for name in ("v1", "v2"):
        by_set[name] = {q.question_id: q for q in LA.wrong_answers(src, name)}
    out = []
    for name, kind in SETS.items():
        missing = [i for i in ids if i not in by_set[name]]
        if missing:
            raise ConfigError(f"{src.where()}: answer set {name} has no answer to {missing[0]} "
                              f"({len(missing)} questions of the answer key missing)")
        out += [AuditItem(name, kind == RIGHT, by_set[name][i]) for i in ids]
    return out, len(key)


# ---- identity and store ---------------------------------------------------------------------
def member_identity(job: JobConfig, llm_cfg: LLMSettings | None) -> dict[str, Any]:
    """What makes two judges the same for the audit: the model that replies and every judge
    setting that changes its verdict (not its name, not judge.input: audit answers have no
    reasoning reply)."""
    llm = job.root.llm if llm_cfg is None or job.root.debug_profile == "scripted" else llm_cfg
    s = job.settings(JudgeSettings)
    return {"llm": identity(llm), "protocol": s.protocol, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "texts": J.judge_texts_fingerprint(job),
            "audit_version": AUDIT_VERSION}


def store_root(job: JobConfig) -> Path:
    paths = job.root.paths
    cache = paths.cache_dir if paths is not None else None
    if cache is None:
        raise ConfigError("judge audit: paths.cache_dir is not set (the audits are stored there)")
    return Path(str(cache)) / "judge_audit"


def judge_dir(job: JobConfig, llm_cfg: LLMSettings | None) -> Path:
    """Where this judge's audits live: one folder per judge identity, one per slice inside."""
    return store_root(job) / stable_hash(member_identity(job, llm_cfg))


def audit_file(job: JobConfig, llm_cfg: LLMSettings | None, st: JudgeAuditSettings,
               commit: str | None) -> Path:
    """audit.json of this judge and slice (written last: its presence means done)."""
    return judge_dir(job, llm_cfg) / slice_name(st.per_set, st.seed, commit) / "audit.json"


def judge_setup(job: JobConfig) -> tuple[JudgeSettings, Sampling, J.OfficialJudges | None]:
    """The judge stage's settings, sampling and official judge texts (protocol paper)."""
    s = job.settings(JudgeSettings)
    texts = J.official_judges(job) if s.protocol == "paper" else None
    return s, Sampling(temperature=s.temperature, max_tokens=s.max_tokens), texts


def stored(job: JobConfig, llm_cfg: LLMSettings | None) -> dict[str, Any] | None:
    """The stored audit of this judge, the one with most items when several slices exist."""
    try:
        folder = judge_dir(job, llm_cfg)
    except ConfigError:
        return None
    found = []
    for path in sorted(folder.glob("*/audit.json")) if folder.is_dir() else ():
        found.append(json.loads(path.read_text(encoding="utf-8")))
    return max(found, key=lambda a: a["items"]) if found else None


def run_audits(job: JobConfig) -> dict[str, dict[str, Any] | None]:
    """judge name -> its stored audit (None = not audited), for every judge of the job."""
    return {name: stored(job, llm_cfg) for name, llm_cfg in judge_members(job)}


def compact(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What report.json keeps of an audit: the rates, their intervals, the slice and source."""
    if summary is None:
        return None
    return {
        "key": summary["key"], "slice": summary["slice"], "source": summary["source"],
        "judge_models": summary["judge_models"], "ci_unit": summary["ci_unit"],
        "sets": {k: {f: v[f] for f in ("kind", "measures", "n", "rate", "ci95", "unjudged")}
                 for k, v in summary["sets"].items()},
        "false_accept": summary["false_accept"], "false_reject": summary["false_reject"],
        "line": one_line(summary),
    }


def short_line(audit: Mapping[str, Any] | None) -> str:
    """The compare table's cell: the four rates and the slice size."""
    if audit is None:
        return "not audited"
    s = audit["sets"]
    per = audit["slice"]["per_set"]
    return (f"FA v1 {_pct(s['v1']['rate'])}, v2 {_pct(s['v2']['rate'])}; FR gold "
            f"{_pct(s['gold']['rate'])}, para. {_pct(s['paraphrase']['rate'])} "
            f"({'full' if per is None else f'{per}/set'})")


# ---- judging ----------------------------------------------------------------------------------
def judge_audit(ctx: StageContext, name: str, backend: LLMBackend, llm_cfg: LLMSettings | None,
                src: S.Source, st: JudgeAuditSettings) -> dict[str, Any]:
    """Judge every item with `backend`, store the audit, return its summary."""
    job = ctx.job
    s, samp, texts = judge_setup(job)
    items, of = audit_items(src, st.per_set, st.seed)
    before = len(ctx.request_frames)
    verdicts = J.judge_with(ctx, name, backend, [it.judge_item() for it in items], samp,
                            s.protocol, texts)
    frames = ctx.request_frames[before:]
    reqs = pl.concat(frames) if frames else None
    sent = 0 if reqs is None else int((~reqs["cache_hit"].fill_null(False)).sum())
    rows = [{"set": it.set, "truth": it.truth, "question_id": it.question.question_id,
             "conversation": it.question.conversation, "category": it.question.category,
             "question": it.question.question, "gold": it.question.gold,
             "answer": it.question.answer, "label": v[2], "judge_model": v[0],
             "prompt_version": v[1], "reply_raw": v[3]} for it, v in zip(items, verdicts)]
    ident = member_identity(job, llm_cfg)
    commit = S.resolved_commit(src)
    summary = {
        "judge_name": name,
        "judge_models": sorted({r["judge_model"] for r in rows}),
        "key": stable_hash(ident),
        "identity": ident,
        "source": LA.describe(src),
        "slice": {"name": slice_name(st.per_set, st.seed, commit), "per_set": st.per_set,
                  "seed": st.seed, "of": of},
        "items": len(rows),
        "requests": 0 if reqs is None else reqs.height,
        "sent": sent,
        **rates(rows),
    }
    out = audit_file(job, llm_cfg, st, commit).parent
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(out / "items.parquet", pl.DataFrame(rows, infer_schema_length=None))
    atomic_write_text(out / "audit.md", markdown(summary))
    atomic_write_text(out / "audit.json", json.dumps(summary, indent=2) + "\n")  # last: done
    summary["path"] = str(out)
    return summary


def _rate(errors: int, n: int) -> dict[str, Any]:
    ci = wilson_ci(errors, n)
    return {"n": n, "errors": errors, "rate": errors / n if n else None,
            "ci95": list(ci) if ci else None}


def rates(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per set: its error rate (false accepts of a wrong set, false rejects of a right one),
    Wilson 95% interval, unjudged count and per category; pooled per kind."""
    def errors(rs: Sequence[Mapping[str, Any]]) -> int:
        return sum((r["label"] is True) != r["truth"] for r in rs)

    sets: dict[str, Any] = {}
    for name, kind in SETS.items():
        rs = [r for r in rows if r["set"] == name]
        by_cat = {}
        for c in sorted({r["category"] for r in rs}):
            cr = [r for r in rs if r["category"] == c]
            by_cat[str(c)] = {"name": LOCOMO_CATEGORIES.get(c, str(c)), **_rate(errors(cr), len(cr))}
        sets[name] = {"kind": kind, "measures": "false accept" if kind == WRONG else "false reject",
                      **_rate(errors(rs), len(rs)),
                      "unjudged": sum(r["label"] is None for r in rs), "by_category": by_cat}
    pooled = {}
    for kind, what in ((WRONG, "false_accept"), (RIGHT, "false_reject")):
        rs = [r for r in rows if SETS[r["set"]] == kind]
        pooled[what] = _rate(errors(rs), len(rs))
    return {"sets": sets, **pooled, "ci_unit": "items (Wilson score interval)"}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ci(r: Mapping[str, Any]) -> str:
    ci = r.get("ci95")
    return "–" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def scope(summary: Mapping[str, Any]) -> str:
    sl = summary["slice"]
    size = (f"all {sl['of']:,} items per set" if sl["per_set"] is None
            else f"a slice of {sl['per_set']} of {sl['of']:,} per set (seed {sl['seed']})")
    commit = (summary["source"].get("commit") or "a work tree")[:7]
    return f"{size}, locomo-audit {commit}"


def one_line(summary: Mapping[str, Any] | None) -> str:
    """The audit as report.md and compare show it beside the judge's name."""
    if summary is None:
        return "not audited (python jobs/report.py judge-audit)"
    s = summary["sets"]
    return (f"false accepts v1 {_pct(s['v1']['rate'])} {_ci(s['v1'])}, v2 {_pct(s['v2']['rate'])} "
            f"{_ci(s['v2'])}; false rejects gold {_pct(s['gold']['rate'])} {_ci(s['gold'])}, "
            f"paraphrase {_pct(s['paraphrase']['rate'])} {_ci(s['paraphrase'])} ({scope(summary)})")


def markdown(summary: Mapping[str, Any]) -> str:
    cats = sorted({c for s in summary["sets"].values() for c in s["by_category"]}, key=int)
    lines = [
        f"# Judge audit: `{summary['judge_name']}` ({', '.join(summary['judge_models'])})",
        "",
        f"Answer sets of known truth from dial481/locomo-audit; {scope(summary)}. Error rate: "
        "a wrong answer accepted (false accept) or a right one not accepted (false reject; an "
        "unjudged reply counts as not accepted, as in judge_accuracy). 95% CI: Wilson score "
        "interval over items.",
        "",
        "| set | truth | n | error | rate | 95% CI | unjudged |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for name, s in summary["sets"].items():
        lines.append(f"| {name} | {s['kind']} | {s['n']} | {s['measures']} | {_pct(s['rate'])} "
                     f"| {_ci(s)} | {s['unjudged']} |")
    lines += ["", "By category (rate, n):", "",
              "| set | " + " | ".join(f"{c} {LOCOMO_CATEGORIES.get(int(c), c)}" for c in cats)
              + " |", "|---|" + "---:|" * len(cats)]
    for name, s in summary["sets"].items():
        cells = [f"{_pct(s['by_category'][c]['rate'])} ({s['by_category'][c]['n']})"
                 if c in s["by_category"] else "–" for c in cats]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Requests: {summary['requests']} ({summary['sent']} sent, the rest from the "
              "response cache)."]
    return "\n".join(lines) + "\n"


def audit_all(ctx: StageContext, backends: Backends, force: bool = False,
              judge: str | None = None) -> list[dict[str, Any]]:
    """Audit every judge of the job (or `judge`), reusing a stored audit unless `force`."""
    job = ctx.job
    st = job.settings(EvalSettings).judge_audit
    src = LA.source(SOURCE_KEY, st.source, job)
    members = judge_members(job)
    if judge is not None:
        members = [m for m in members if m[0] == judge]
        if not members:
            raise ConfigError(f"judge-audit: --judge {judge!r} is not a judge of the config "
                              f"({[n for n, _ in judge_members(job)]})")
    if not members:
        raise ConfigError("judge-audit: the config has no judge")
    commit = S.resolved_commit(src)
    out = []
    for name, llm_cfg in members:
        path = audit_file(job, llm_cfg, st, commit)
        if path.is_file() and not force:
            log.info("judge audit of %s: reused %s", name, path)
            out.append({**json.loads(path.read_text(encoding="utf-8")), "path": str(path.parent),
                        "reused": True})
            continue
        backend = backends.judge(name, llm_cfg)
        out.append({**judge_audit(ctx, name, backend, llm_cfg, src, st), "reused": False})
    return out


def run_command(job: JobConfig, force: bool = False, judge: str | None = None
                ) -> list[dict[str, Any]]:
    """`jobs/report.py judge-audit`: no run directory; servers log under the store."""
    work = RunDir(store_root(job))  # server logs go to <store>/logs
    with Backends(job, work) as backends:
        ctx = StageContext(job, work, STAGE, backends)
        return audit_all(ctx, backends, force, judge)


def print_audits(job: JobConfig, force: bool = False, judge: str | None = None) -> None:
    """The command's output: each audit's table and where it is stored."""
    for audit in run_command(job, force, judge):
        print(markdown(audit))
        how = "reused from the audit store" if audit["reused"] else f"{audit['sent']} requests sent"
        print(f"stored: {audit['path']} ({how})")


def run_stage(ctx: StageContext) -> dict[str, pl.DataFrame]:
    done = audit_all(ctx, ctx.backends)
    # The judge's requests carry stage "judge": logged here as this stage's own.
    ctx.request_frames[:] = [f.with_columns(pl.lit(STAGE.name).alias("stage"))
                             for f in ctx.request_frames]
    ctx.notes.update(audits={a["judge_name"]: {"key": a["key"], "slice": a["slice"]["name"],
                                               "reused": a["reused"], "sent": a["sent"]}
                             for a in done})
    return {}


def estimate(inp: EstimateInputs) -> StageEstimate:
    """Every judge without a stored audit of this slice judges every item: the real items'
    prompts under the judge's own builder (J.build_request), one label of completion each."""
    job = inp.job
    st = job.settings(EvalSettings).judge_audit
    src = LA.source(SOURCE_KEY, st.source, job)
    commit = S.resolved_commit(src)
    todo = [(n, c) for n, c in judge_members(job)
            if not audit_file(job, c, st, commit).is_file()]
    s, samp, texts = judge_setup(job)
    items, _ = audit_items(src, st.per_set, st.seed)
    reqs = [J.build_request(it.judge_item(), "audit", samp, s.protocol, texts) for it in items]
    prompt = sum(inp.counter.messages(r.messages) for r in reqs)
    return StageEstimate(
        STAGE.name, len(reqs) * len(todo), prompt * len(todo),
        len(reqs) * len(todo) * min(s.max_tokens, J.JUDGE_PAPER_COMPLETION),
        f"{len(reqs)} items x {len(todo)} judge(s) without a stored audit "
        f"({slice_name(st.per_set, st.seed, commit)})")


def _fingerprint(job: JobConfig) -> Any:
    st = job.settings(EvalSettings).judge_audit
    return {"members": [member_identity(job, c) for _, c in judge_members(job)],
            "source": st.source, "per_set": st.per_set, "seed": st.seed}


STAGE = Stage(
    name="judge_audit",
    run=run_stage,
    writes=(),
    extra_fingerprint=_fingerprint,
    version=AUDIT_VERSION,
    uses=("judges",),
    estimate=estimate,
    part=AUDIT,
)
