"""LoCoMo judge, protocol `paper`: the Mem0-style judge behind the published numbers.

Own wording of the semantics in docs/evaluation.md "Judge protocols" (Mem0's `ACCURACY_PROMPT`,
which the StructMem reference reuses unchanged): ONE user message, no system message; the
question is framed as one conversation partner asking the other about their shared history;
grading is generous on topic (a longer answer that touches on the gold answer's topic counts,
even in passing) and on time
(another format, or a relative expression for the same date or period, counts); one illustrative
question/gold pair; a one-sentence justification is asked for, then only the label as JSON under
`label`. Scored 1 iff the label is exactly `CORRECT` (case-sensitive), so

    {"label": "CORRECT"} -> True    {"label": "correct"} -> False    no JSON -> None (unjudged)

The reply is constrained to a JSON object with a string `label` (the JSON mode of the
published call), not to an enum: a label the model spells otherwise stays visible as WRONG.
"""

from __future__ import annotations

import json
import re
from typing import Any

from structmem_gpu.llm.types import Message

_FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)
VERSION = "judge_locomo_paper/2"  # 2: "touches on" the topic (was "addresses")
POSITIVE = "CORRECT"

TEMPLATE = """You are grading one answer. Two people have talked with each other over many \
sessions, and one of them now asks the other a question about something from their shared \
history. You get that question, the gold answer (the short ground truth) and a generated \
answer. Label the generated answer CORRECT or WRONG.

Grade generously. The gold answer is usually short and the generated answer may say much \
more; as long as the generated answer touches on the topic of the gold answer, even in \
passing, it is CORRECT.

For a question about time, grade generously as well: if the generated answer points to the \
same date or period as the gold answer, it is CORRECT even when it is written in another \
format ("May 7th" for "7 May") or as a relative expression ("the week before the trip", \
"last Tuesday") that denotes that date or period.

Example: question "What did Maya cook for her parents' anniversary?", gold answer "lasagna", \
generated answer "She baked a big lasagna from her grandmother's recipe" - CORRECT.

Question: {question}
Gold answer: {gold}
Generated answer: {prediction}

First explain your decision in one sentence, then give the label, CORRECT or WRONG - never \
both. Return only the label as a JSON object with the key "label"."""


def schema() -> dict[str, Any]:
    """A JSON object holding a string label (JSON mode), no enum, no reasoning field."""
    return {
        "type": "object",
        "properties": {"label": {"type": "string", "maxLength": 16}},
        "required": ["label"],
    }


def build_messages(question: str, gold: str, prediction: str) -> tuple[Message, ...]:
    text = TEMPLATE.format(question=question, gold=gold, prediction=prediction)
    return (Message("user", text),)


def extract_json(text: str) -> Any:
    """Mem0's `extract_json`: a fenced block's body, else the text from the first `{` to the
    last `}`; then json.loads. Raises ValueError when there is no JSON to read."""
    body = text.strip()
    if "```" in body:
        inner = body.split("```", 2)[1]
        body = inner[4:] if inner.startswith("json") else inner
    start, end = body.find("{"), body.rfind("}")
    if start == -1 or end < start:
        raise ValueError("no JSON object in the reply")
    return json.loads(body[start : end + 1])


def extract_json_lightmem(text: str) -> Any:
    """LightMem's copy of the judge (experiments/locomo/llm_judge.py) reads a fenced block's
    body, else the whole text, with json.loads (no `{`…`}` search)."""
    body = text.strip()
    m = _FENCED.search(body)
    return json.loads(m.group(1) if m else body)


def parse_label(text: str | None, lightmem: bool = False) -> bool | None:
    """True iff the reply's JSON `label` is exactly "CORRECT"; None when unreadable. The JSON
    is read as mem0's judge reads it, or as LightMem's copy does (`lightmem`, when the judge
    text comes from prompts.sources.lightmem)."""
    if not text:
        return None
    try:
        obj = extract_json_lightmem(text) if lightmem else extract_json(text)
    except ValueError:  # json.JSONDecodeError is a ValueError
        return None
    if not isinstance(obj, dict) or "label" not in obj:
        return None
    return obj["label"] == POSITIVE
