"""The judge's settings (conf/judge/*.yaml; conf/judge/_base.yaml is generated from them): the
`judge` node every job has, read by the judge stage (eval/judge.py), the backends that open
each judge's model (stage.Backends), the GPU plan, the preflight and the dry run (node/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.config.settings import Note, Settings, TEMPERATURE, TOKENS

# judge.protocol values: paper = the published judges' call and label rule; reasoned = our
# earlier reasoning-first, schema-constrained variant.
PROTOCOLS = ("paper", "reasoned")
# judge.input values: reply = the reader's whole reply (answers.reply, what the reference
# pipelines pass to their judges); answer = the extracted prediction.
INPUTS = ("reply", "answer")


class PanelMember(Settings):
    name: Annotated[str, Note("each panel member needs a name")]
    llm: LLMSettings | None = None  # None = the answer model


class JudgeSettings(Settings):
    """The `judge` config (conf/judge/*.yaml). `llm: null` = the answer model; a `panel`
    judges with every member; `*_llm` keys hold llm configs the panel refers to. The group's
    base (conf/judge/_base.yaml) is generated from these fields below its header; each judge
    file lists it first and states only what differs."""

    node: ClassVar[str] = "judge"
    yaml_home: ClassVar[str | None] = "judge/_base.yaml"
    open_keys: ClassVar[Mapping[str, Any]] = {"*_llm": LLMSettings}

    name: str = Field("same_as_llm", description=(
        "Stored in judgments.judge_name; several judges give one row per (question, judge)."))
    llm: LLMSettings | None = Field(None, description=(
        "null = reuse the answer model's backend; else a full llm config (see conf/judge/*.yaml)."))
    panel: tuple[PanelMember, ...] | None = Field(None, description=(
        "A list of {name, llm} for several judges in one stage (judge robustness); null = just "
        "this one."))
    protocol: Literal[PROTOCOLS] = Field("paper", description=(
        "Judge protocol: paper = the published judges (LoCoMo: Mem0's call, one user message, "
        "label JSON, 1 iff exactly CORRECT; LongMemEval: evaluate_qa.py's per-type yes/no, "
        "max_tokens 10, 'yes' in reply); reasoned = our reasoning-first schema judge (system "
        "message, any-case label). Published rows are shown only for paper."))
    input: Literal[INPUTS] = Field("reply", description=(
        "What the judge sees: reply = the reader's whole reply (reasoning included), as every "
        "reference pipeline passes it (LightMem search_locomo.py -> evaluate_llm_judge, "
        "LongMemEval's evaluate_qa.py hypothesis); answer = the extracted answer line. Only "
        "readers that end in an `Answer:` line (our paper reader) differ: SEEM's and the "
        "baselines' readers reply with the answer itself. Lexical metrics (F1, BLEU-1) always "
        "score the extracted answer."))
    max_tokens: TOKENS = Field(128, description=(
        "Reply budget (LongMemEval paper judge: min(this, 10)). reasoned needs room for its "
        "reasoning."))
    temperature: TEMPERATURE = Field(0.0, description="Sampling temperature (0 = greedy decoding).")

    def members(self) -> list[tuple[str, LLMSettings | None]]:
        """(name, its llm settings or None = the answer model) of every judge: the panel's
        members, else this one judge."""
        if self.panel:
            return [(m.name, m.llm) for m in self.panel]
        return [(self.name, self.llm)]
