"""LLM-as-judge for LongMemEval: yes / no with a rule per question type
(docs/evaluation.md "Judge protocols").

Own wording of the rules of xiaowu0162/LongMemEval `src/evaluation/evaluate_qa.py`:

| rule             | used for                                          |
|------------------|---------------------------------------------------|
| default          | single-session-user / -assistant, multi-session   |
| temporal         | temporal-reasoning (off-by-one counts tolerated)  |
| knowledge_update | knowledge-update (old value may also be mentioned)|
| preference       | single-session-preference (gold is a rubric)      |
| abstention       | every `_abs` question, whatever its type          |

The official script passes iff `'yes' in reply.lower()`; we constrain the reply to a schema
with a `label` enum yes/no (a deviation, recorded as this prompt's VERSION). Example reply:

    {"reasoning": "The response names Northwind, the updated employer.", "label": "yes"}
"""

from __future__ import annotations

from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "judge_longmemeval/1"
POSITIVE, NEGATIVE = "yes", "no"
LABELS = (POSITIVE, NEGATIVE)

_DEFAULT = (
    "Say yes if the response contains the correct answer, is equivalent to it, or "
    "contains all the intermediate steps that lead to it. Say no if the response gives "
    "a different answer or only part of the required information."
)
RULES: dict[str, str] = {
    "default": _DEFAULT,
    "temporal": _DEFAULT
    + (
        " Do not penalise off-by-one errors in a number of days, weeks or "
        "months (for example 19 days when the correct answer is 18 days)."
    ),
    "knowledge_update": (
        "The correct answer is the latest value of something that changed over "
        "time. Say yes if the response gives this updated answer, even if it also "
        "mentions the earlier information. Otherwise say no."
    ),
    "preference": (
        "The correct answer is a rubric describing a good personalised response. Say "
        "yes if the response satisfies the rubric: it need not cover every point, but "
        "it must recall and use the user's personal information correctly. Otherwise "
        "say no."
    ),
    "abstention": (
        "The question cannot be answered from the chat history; the correct answer "
        "explains why. Say yes if the response recognises that the question cannot be "
        "answered, for example by saying the information was never mentioned or that "
        "only related but different information was given. Say no if the response "
        "answers as if the information were known."
    ),
}
_TYPE_RULE = {
    "temporal-reasoning": "temporal",
    "knowledge-update": "knowledge_update",
    "single-session-preference": "preference",
}

SYSTEM = """You check whether a chat assistant's response answers a question about its past \
conversations with the user. You get the question, the correct answer and the response.
{rule}
Reply with JSON: first one short sentence of reasoning, then the label, exactly yes or no."""


def rule_for(question_type: str, is_abstention: bool) -> str:
    """The rule name for a question: abstention overrides the type, as in evaluate_qa.py."""
    if is_abstention:
        return "abstention"
    return _TYPE_RULE.get(question_type, "default")


def schema(reasoning_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": max(1, reasoning_chars)},
            "label": {"type": "string", "enum": list(LABELS)},
        },
        "required": ["reasoning", "label"],
        "additionalProperties": False,
    }


def build_messages(
    question: str, gold: str, prediction: str, question_type: str, is_abstention: bool
) -> tuple[Message, ...]:
    system = SYSTEM.format(rule=RULES[rule_for(question_type, is_abstention)])
    user = f"Question: {question}\nCorrect answer: {gold}\nResponse: {prediction}"
    return (Message("system", system), Message("user", user))
