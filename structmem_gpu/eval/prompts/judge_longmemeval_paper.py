"""LongMemEval judge, protocol `paper`: the call of `src/evaluation/evaluate_qa.py`.

Own wording of the per-type rules in docs/evaluation.md "Judge protocols": ONE user message per
question, the rule chosen by question type (any `_abs` question takes the abstention rule), the
question, the reference (labelled as a rubric for preferences, as an explanation for abstention)
and the response, ending in a bare yes/no question. `max_tokens` 10 (MAX_TOKENS), temperature 0,
no schema, and the official pass rule `'yes' in reply.lower()` (a substring test: "Yes." and
"yes, it does" pass). An empty reply or a failed request is unjudged (label None), which the
report counts as wrong, as the official script counts an unreadable reply as no.
"""

from __future__ import annotations

from structmem_gpu.llm.types import Message
from structmem_gpu.eval.prompts.judge_longmemeval import rule_for

VERSION = "judge_longmemeval_paper/1"
MAX_TOKENS = 10  # evaluate_qa.py's max_tokens

_INTRO = "Below are a question, {ref_what} and a response from a chat assistant."
_CONTAINS = (
    "Answer yes if the response contains the correct answer, is equivalent to it, or shows "
    "all the intermediate steps that lead to it. Answer no if it gives a different answer or "
    "covers only part of the information the correct answer needs."
)
RULES: dict[str, tuple[str, str, str, str]] = {
    # rule -> (what the reference is, its field label, the instruction, the closing question)
    "default": ("the correct answer", "Correct answer", _CONTAINS, "Is the response correct?"),
    "temporal": (
        "the correct answer",
        "Correct answer",
        _CONTAINS
        + " Do not answer no only because of an off-by-one error in a count of days, weeks, "
        "months or similar units (19 days when the correct answer is 18 days is still yes).",
        "Is the response correct?",
    ),
    "knowledge_update": (
        "the correct answer",
        "Correct answer",
        "The correct answer is the latest value of something that changed over time. Answer "
        "yes if the response gives this updated answer; it may mention the earlier, superseded "
        "information as well. Otherwise answer no.",
        "Is the response correct?",
    ),
    "preference": (
        "a rubric",
        "Rubric",
        "The rubric describes what a good personalised response to the question looks like. "
        "Answer yes if the response satisfies the rubric: it does not have to cover every point "
        "of it, but it must recall and use the user's personal information correctly. "
        "Otherwise answer no.",
        "Does the response satisfy the rubric?",
    ),
    "abstention": (
        "an explanation",
        "Explanation",
        "The question cannot be answered from the conversation history, and the explanation "
        "says why. Answer yes if the response correctly identifies the question as "
        "unanswerable, for example by saying the information was never given, or that only "
        "related but different information was. Answer no if it answers as if it knew.",
        "Does the response correctly identify the question as unanswerable?",
    ),
}


def build_messages(
    question: str, gold: str, prediction: str, question_type: str, is_abstention: bool
) -> tuple[Message, ...]:
    ref_what, ref_label, rule, closing = RULES[rule_for(question_type, is_abstention)]
    text = "\n\n".join(
        [
            _INTRO.format(ref_what=ref_what),
            rule,
            f"Question: {question}",
            f"{ref_label}: {gold}",
            f"Response: {prediction}",
            f"{closing} Answer yes or no only.",
        ]
    )
    return (Message("user", text),)


def parse_label(text: str | None) -> bool | None:
    """The official rule: passed iff 'yes' occurs in the lowercased reply; None if empty."""
    if text is None or not text.strip():
        return None
    return "yes" in text.lower()
