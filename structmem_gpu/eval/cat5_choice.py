"""LoCoMo category 5 as LoCoMo's paper asks it: a forced choice (`eval.cat5=forced_choice`).

LoCoMo's adversarial questions are unanswerable from the conversation; its paper gives the
reader two options, "Not mentioned in the conversation" and the file's `adversarial_answer`
(the distractor), in an order fixed per question, and scores the option chosen. The published
memory pipelines instead score a free answer by the "not mentioned" rule (eval/judge.py
RULE_CAT5, our default `eval.cat5=rule`). Under forced_choice:

- the answer stage appends the two options to each selected category-5 question's text (our
  wording; order by `eval.cat5_seed` and the question id, the same on every machine);
- the judge stage scores the reply by the option it names, `(a)`/`(b)` or the option's text
  (judge_model RULE, no LLM call): correct iff "Not mentioned in the conversation"; a reply
  naming neither or both options is unjudged (counted as wrong);
- the report gives category 5 its own block (`category_5_forced_choice`) and leaves it out of
  `overall` and `by_category`, so no published-comparable number holds it.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import EvalSettings
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL
from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED

RULE = "rule:locomo-cat5-choice"
VERSION = "locomo_cat5_choice/1"
FORCED_CHOICE = "forced_choice"
_MARKS = ("a", "b")


def options(question_id: str, adversarial: str, seed: int) -> tuple[str, str]:
    """(option a, option b): "Not mentioned in the conversation" and the distractor, in the
    order the seed and the question id fix."""
    first = int(stable_hash("cat5-choice", seed, question_id), 16) % 2 == 0
    return (NOT_MENTIONED, adversarial) if first else (adversarial, NOT_MENTIONED)


def question_options(job: JobConfig, questions: pl.DataFrame
                     ) -> dict[str, tuple[str, str]] | None:
    """question_id -> its options for every category-5 question under forced_choice (the
    distractor: `adversarial_answer`, else the gold the loader gave it); None under `rule`."""
    ev = job.settings(EvalSettings)
    if ev.cat5 != FORCED_CHOICE:
        return None
    cat5 = questions.filter(pl.col("category") == LOCOMO_ADVERSARIAL)
    return {qid: options(qid, adv or gold or "", ev.cat5_seed) for qid, adv, gold in
            cat5.select("question_id", "adversarial_answer", "answer").iter_rows()}


def fingerprint(job: JobConfig) -> list[Any] | None:
    """What the answer and judge stages add to their fingerprints: None under the default
    `rule`, so a run at the defaults keeps its fingerprints."""
    ev = job.settings(EvalSettings)
    return None if ev.cat5 == "rule" else [ev.cat5, ev.cat5_seed]


def ask(question: str, opts: tuple[str, str]) -> str:
    """The question as the reader sees it under forced choice."""
    return f"{question.rstrip()} Choose one answer: (a) {opts[0]} or (b) {opts[1]}."


def chosen(reply: str, opts: tuple[str, str]) -> int | None:
    """The option the reply names: by its mark "(a)" / "b)" / "a." at the start, else by its
    text; None when it names neither or both."""
    text = (reply or "").strip().lower()
    marks = {i for i, m in enumerate(_MARKS)
             if re.search(rf"\(\s*{m}\s*\)|^{m}\s*[\).:]|^{m}$|\boption {m}\b", text)}
    if len(marks) == 1:
        return marks.pop()
    named = {i for i, o in enumerate(opts) if o.strip().strip(".").lower() in text}
    if len(named) == 1 and not marks:
        return named.pop()
    return None


def label(reply: str, opts: tuple[str, str]) -> bool | None:
    """True iff the chosen option is "Not mentioned in the conversation"; None = unjudged."""
    c = chosen(reply, opts)
    return None if c is None else opts[c] == NOT_MENTIONED
