"""LLM-as-judge for LoCoMo-format benchmarks: CORRECT / WRONG, Mem0-style semantics.

Own wording of the protocol in docs/evaluation.md "Judge protocols": generous on topic (a longer
answer that addresses the same thing counts), generous on time (another date format, or a
relative expression that denotes the same date or period, counts), binary label, temperature 0.
The reply is constrained by a schema whose `reasoning` field comes before the `label` enum, so
the model states its reason before committing. Example reply:

    {"reasoning": "Both name the same city.", "label": "CORRECT"}
"""

from __future__ import annotations

from typing import Any

from structmem_gpu.llm.types import Message

VERSION = "judge_locomo/1"
POSITIVE, NEGATIVE = "CORRECT", "WRONG"
LABELS = (POSITIVE, NEGATIVE)

SYSTEM = """You grade answers to questions that one person asks another about their shared \
conversation history. You get the question, the gold answer and a generated answer.
Label the generated answer CORRECT or WRONG:
- Be generous about wording. If the generated answer refers to the same thing as the gold \
answer, it is CORRECT, even when it is longer or adds details, as long as it does not \
contradict the gold answer.
- Be generous about time. A date in another format, or a relative expression that means the \
same date or period as the gold answer, is CORRECT (gold "7 May 2023", answer "May 7th, 2023").
- Otherwise it is WRONG.
Example: question "Where did Jon go on vacation?", gold "Rome", generated "He visited Rome, \
Italy in June" -> CORRECT.
Reply with JSON: first one short sentence of reasoning, then the label (exactly one of \
CORRECT or WRONG)."""


def schema(reasoning_chars: int) -> dict[str, Any]:
    """Reasoning before label; reasoning bounded so a capped reply still fits max_tokens."""
    return {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": max(1, reasoning_chars)},
            "label": {"type": "string", "enum": list(LABELS)},
        },
        "required": ["reasoning", "label"],
        "additionalProperties": False,
    }


def build_messages(question: str, gold: str, prediction: str) -> tuple[Message, ...]:
    user = f"Question: {question}\nGold answer: {gold}\nGenerated answer: {prediction}"
    return (Message("system", SYSTEM), Message("user", user))
