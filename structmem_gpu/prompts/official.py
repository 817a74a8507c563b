"""The official prompt texts, read at run time from the user's checkouts (docs/evaluation.md "Official
texts"); none of them is part of this repository.

    prompts.sources.lightmem     zjunlp/LightMem: build prompts, each from the file its LoCoMo
                                 build reads it from (LIGHTMEM_FILES: the extraction prompts
                                 from experiments/locomo/prompts.py, the consolidation template
                                 and UPDATE_PROMPT from src/lightmem/memory/prompts.py), the
                                 consolidation system message (src/lightmem/memory/utils.py
                                 call_summary_llm), the readers (experiments/locomo/prompts.py
                                 ANSWER_PROMPT_StructMem, ANSWER_PROMPT), the LoCoMo judge
                                 (experiments/locomo/llm_judge.py ACCURACY_PROMPT)
    prompts.sources.mem0         mem0ai/mem0 before 9315e30: the LoCoMo judge
                                 (evaluation/metrics/llm_judge.py ACCURACY_PROMPT)
    prompts.sources.longmemeval  xiaowu0162/LongMemEval: the per-type judge templates of
                                 src/evaluation/evaluate_qa.py get_anscheck_prompt

`prompts.reference_dir` is the older name of `prompts.sources.lightmem` (conf/config.yaml
makes one the default of the other). The LoCoMo judge text comes from mem0 when mem0 is given
(the origin of that judge, and the only text mem0 supplies, so naming it is a deliberate
choice), else from LightMem (character-identical copies at mem0 b3ede5b / LightMem 8fc9a91).
"""

from __future__ import annotations

import ast
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.prompts import sources as S

SOURCE_NAMES = ("lightmem", "mem0", "longmemeval")
# LightMem keeps two files of prompts with partly equal names and partly different texts: the
# package's (src/lightmem/memory/prompts.py) and its LoCoMo scripts' (experiments/locomo/
# prompts.py, `from prompts import ...` in add_locomo.py and search_locomo.py).
LIGHTMEM_PACKAGE_PROMPTS = "src/lightmem/memory/prompts.py"
LIGHTMEM_LOCOMO_PROMPTS = "experiments/locomo/prompts.py"
LIGHTMEM_READER_FILE = LIGHTMEM_LOCOMO_PROMPTS
LIGHTMEM_JUDGE_FILE = "experiments/locomo/llm_judge.py"
MEM0_JUDGE_FILE = "evaluation/metrics/llm_judge.py"
LONGMEMEVAL_FILE = "src/evaluation/evaluate_qa.py"
LONGMEMEVAL_FUNCTION = "get_anscheck_prompt"
# The one home of "which file": each LightMem text by name, from the file the official LoCoMo
# code path reads it from (LightMem 8fc9a91).
LIGHTMEM_FILES = {
    # add_locomo.py imports them from its own prompts.py and passes them to add_memory as
    # METADATA_GENERATE_PROMPT ({"factual", "relational"} with --extraction_mode event, the
    # flat text alone with flat).
    "LoCoMo_Event_Binding_factual": LIGHTMEM_LOCOMO_PROMPTS,
    "LoCoMo_Event_Binding_relational": LIGHTMEM_LOCOMO_PROMPTS,
    "METADATA_GENERATE_PROMPT_locomo": LIGHTMEM_LOCOMO_PROMPTS,
    # utils.call_summary_llm imports it from the package (`from lightmem.memory.prompts import`).
    "LoCoMo_Cross_Event_Consolidation": LIGHTMEM_PACKAGE_PROMPTS,
    # lightmem.py (LightMemory.offline_update_all_entries) imports it from the package.
    "UPDATE_PROMPT": LIGHTMEM_PACKAGE_PROMPTS,
    # search_locomo.py imports them from its own prompts.py.
    "ANSWER_PROMPT_StructMem": LIGHTMEM_LOCOMO_PROMPTS,
    "ANSWER_PROMPT": LIGHTMEM_LOCOMO_PROMPTS,
}
# add_locomo.py's extraction prompts per --extraction_mode (extract.reference_mode): event =
# StructMem (both perspectives), flat = LightMem's flat memory (the factual perspective only).
EXTRACTION_NAMES = {
    "event": {"fact": "LoCoMo_Event_Binding_factual",
              "relation": "LoCoMo_Event_Binding_relational"},
    "flat": {"fact": "METADATA_GENERATE_PROMPT_locomo"},
}
SYNTHESIS_NAME = "LoCoMo_Cross_Event_Consolidation"
# The StructMem build prompts by use (methods/structmem/prompts/reference.py fills them).
BUILD_NAMES = {**EXTRACTION_NAMES["event"], "synthesis": SYNTHESIS_NAME}
# The consolidation request's fixed parts written in code, not in a prompts file: the literal
# system message of call_summary_llm and the text it sends when no related entry was found.
LIGHTMEM_UTILS_FILE = "src/lightmem/memory/utils.py"
SUMMARY_FUNCTION = "call_summary_llm"
# The offline update's system prompt (LightMemory.offline_update_all_entries; methods/structmem/prompts/update.py
# fills the user message). Kept out of BUILD_NAMES: only the update stage reads it.
UPDATE_NAME = "UPDATE_PROMPT"
# Readers of experiments/locomo/prompts.py (search_locomo.py): with event summaries (StructMem,
# --enable-summary) and without (LightMem; our flat memory), with the fields each is filled with.
_SPEAKER_FIELDS = ("speaker_1_name", "speaker_1_memories", "speaker_2_name",
                   "speaker_2_memories", "question")
READERS = {
    "ANSWER_PROMPT_StructMem": (*_SPEAKER_FIELDS, "session_summaries"),
    "ANSWER_PROMPT": _SPEAKER_FIELDS,
}
READER_NAME = "ANSWER_PROMPT_StructMem"
JUDGE_NAME = "ACCURACY_PROMPT"
JUDGE_FIELDS = ("question", "gold_answer", "generated_answer")
# LongMemEval question types and the abstention template (any `_abs` question).
LONGMEMEVAL_TYPES = ("single-session-user", "single-session-assistant", "multi-session",
                     "temporal-reasoning", "knowledge-update", "single-session-preference")
ABSTENTION = "abstention"


@dataclass(frozen=True)
class OfficialText:
    source: str  # lightmem | mem0 | longmemeval
    file: str
    name: str  # variable, or function[branch]
    text: str
    commit: str | None

    @property
    def digest(self) -> str:
        return stable_hash(self.text, length=10)

    def version(self, kind: str) -> str:
        """prompt_version of requests filled from this text: a changed text is a new version;
        the commit is not part of it (the same text at another commit keeps the cache)."""
        return f"official-{kind}/{self.digest}"

    def record(self) -> dict[str, Any]:
        return {"file": self.file, "name": self.name, "commit": self.commit,
                "sha256_10": self.digest}


def source_spec(job: JobConfig, name: str) -> str | None:
    """The configured `prompts.sources.<name>` (LightMem: or its alias prompts.reference_dir)."""
    prompts = job.root.prompts
    sources = prompts.sources if prompts is not None else None
    value = getattr(sources, name) if sources is not None else None
    if name == "lightmem":
        alias = prompts.reference_dir if prompts is not None else None
        if alias is not None and value is not None and str(alias) != str(value):
            raise ConfigError(
                f"prompts.reference_dir={alias!r} and prompts.sources.lightmem={value!r} differ; "
                "prompts.reference_dir is the older name of prompts.sources.lightmem: set one"
            )
        value = value if value is not None else alias
    return None if value is None else str(value)


def _src(name: str, spec: str) -> S.Source:
    return S.parse(f"prompts.sources.{name}", spec)


def _fields_check(src: S.Source, t: OfficialText, fields: tuple[str, ...], what: str) -> None:
    named = {f for _, f, _, _ in string.Formatter().parse(t.text) if f is not None}
    if named != set(fields):
        raise ConfigError(
            f"{src.where()}: {t.name} in {t.file} at {S.describe_commit(src)} has fields "
            f"{sorted(named)}, expected {sorted(fields)} ({what})"
        )


def _constant(
    name: str, spec: str, file: str, var: str, what: str
) -> tuple[S.Source, OfficialText]:
    src = _src(name, spec)
    text = S.string_constant(src, file, var, what)
    return src, OfficialText(name, file, var, text, S.resolved_commit(src))


def lightmem_build(spec: str, var: str, what: str) -> OfficialText:
    """A LightMem text read from the file its LoCoMo code path reads it from (LIGHTMEM_FILES;
    methods/structmem/prompts/reference.py fills the build prompts)."""
    if var not in LIGHTMEM_FILES:
        raise ConfigError(f"prompts.sources.lightmem: no LightMem text {var!r} is known; "
                          f"expected one of {sorted(LIGHTMEM_FILES)}")
    return _constant("lightmem", spec, LIGHTMEM_FILES[var], var, what)[1]


def build_texts(spec: str) -> dict[str, OfficialText]:
    """The StructMem build prompts by use (fact, relation, synthesis), the flat mode's factual
    prompt ("fact[flat]") and the consolidation call's fixed parts ("synthesis[system]",
    "synthesis[no_context]")."""
    out = {use: lightmem_build(spec, var, f"the {use} prompt") for use, var in BUILD_NAMES.items()}
    out["fact[flat]"] = lightmem_build(spec, EXTRACTION_NAMES["flat"]["fact"],
                                       "the flat mode's factual prompt")
    out.update({f"synthesis[{k}]": t for k, t in lightmem_summary_call(spec).items()})
    return out


def _summary_what(src: S.Source) -> str:
    return f"{SUMMARY_FUNCTION} in {LIGHTMEM_UTILS_FILE} at {S.describe_commit(src)}"


def _system_content(fn: ast.FunctionDef) -> str | None:
    """The "content" string of the first dict literal in `fn` with "role": "system"."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Dict):
            continue
        items = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                 if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        role, content = items.get("role"), items.get("content")
        if (isinstance(role, ast.Constant) and role.value == "system"
                and isinstance(content, ast.Constant) and isinstance(content.value, str)):
            return content.value
    return None


def _no_context(fn: ast.FunctionDef) -> str | None:
    """The fallback string of `supplementary_context=<text> or "..."` in `fn`'s format call."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            v = kw.value
            if (kw.arg == "supplementary_context" and isinstance(v, ast.BoolOp)
                    and isinstance(v.op, ast.Or) and isinstance(v.values[-1], ast.Constant)
                    and isinstance(v.values[-1].value, str)):
                return v.values[-1].value
    return None


def lightmem_summary_call(spec: str) -> dict[str, OfficialText]:
    """The consolidation request's fixed parts as call_summary_llm writes them in code (read
    from its AST, never executed): "system", the literal content of its {"role": "system"}
    message, and "no_context", what it fills {supplementary_context} with when no related
    entry was found. A ConfigError names what is absent."""
    src = _src("lightmem", spec)
    fn = S.function(src, LIGHTMEM_UTILS_FILE, SUMMARY_FUNCTION, "the consolidation call")
    found = {"system": _system_content(fn), "no_context": _no_context(fn)}
    shapes = {"system": '{"role": "system", "content": "<literal text>"}',
              "no_context": 'supplementary_context=<text> or "<literal text>"'}
    missing = [f"{k} ({shapes[k]})" for k, v in found.items() if v is None]
    if missing:
        raise ConfigError(f"{src.where()}: {_summary_what(src)} has no literal "
                          f"{' and no '.join(missing)} (the consolidation request's fixed parts)")
    commit = S.resolved_commit(src)
    return {k: OfficialText("lightmem", LIGHTMEM_UTILS_FILE, f"{SUMMARY_FUNCTION}[{k}]", str(v),
                            commit) for k, v in found.items()}


def lightmem_update(spec: str) -> OfficialText:
    """The offline update's system prompt (the update stage sends it as is)."""
    return lightmem_build(spec, UPDATE_NAME, "the offline update prompt")


def lightmem_reader(spec: str, name: str = READER_NAME) -> OfficialText:
    """A reader template of READERS (search_locomo.py fills it with str.format)."""
    what = f"the reader {name}"
    src, t = _constant("lightmem", spec, LIGHTMEM_FILES[name], name, what)
    _fields_check(src, t, READERS[name], what)
    return t


def locomo_judge(lightmem: str | None, mem0: str | None) -> OfficialText | None:
    """The LoCoMo judge template: mem0's when given, else LightMem's, else None (ours)."""
    if mem0 is not None:
        try:
            src, t = _constant("mem0", mem0, MEM0_JUDGE_FILE, JUDGE_NAME, "the LoCoMo judge")
        except ConfigError as e:  # the usual cause, named
            raise ConfigError(f"{e} (mem0's judge exists only before commit 9315e30: give "
                              "PATH@b3ede5b)") from e
    elif lightmem is not None:
        src, t = _constant("lightmem", lightmem, LIGHTMEM_JUDGE_FILE, JUDGE_NAME,
                           "the LoCoMo judge")
    else:
        return None
    _fields_check(src, t, JUDGE_FIELDS, "the LoCoMo judge")
    return t


def _branch_types(test: ast.expr) -> list[str] | None:
    """Question types an `if task in [...]` / `if task == '...'` test selects; None otherwise."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.left, ast.Name)):
        return None
    op, right = test.ops[0], test.comparators[0]
    if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
        return [right.value]
    if isinstance(op, ast.In) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
        vals = [e.value for e in right.elts if isinstance(e, ast.Constant)]
        return [v for v in vals if isinstance(v, str)]
    return None


def _template_of(body: list[ast.stmt]) -> str | None:
    for node in body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and any(isinstance(t, ast.Name) and t.id == "template" for t in node.targets)):
            return node.value.value
    return None


def _type_templates(stmts: list[ast.stmt], out: dict[str, str]) -> None:
    """Walk an if/elif chain on the question type, collecting `template = "..."` per type."""
    for node in stmts:
        while isinstance(node, ast.If):
            types = _branch_types(node.test)
            tpl = _template_of(node.body)
            if types is not None and tpl is not None:
                for t in types:
                    out.setdefault(t, tpl)
            if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                node = node.orelse[0]
            else:
                break


def longmemeval_judges(spec: str) -> dict[str, OfficialText]:
    """get_anscheck_prompt's templates by question type, plus "abstention": read from the
    function's AST — `if not abstention: <if/elif on task> else: template = ...`."""
    src = _src("longmemeval", spec)
    fn = S.function(src, LONGMEMEVAL_FILE, LONGMEMEVAL_FUNCTION, "the LongMemEval judge")
    found: dict[str, str] = {}
    for node in fn.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp) \
                and isinstance(node.test.op, ast.Not):
            _type_templates(node.body, found)
            abst = _template_of(node.orelse)
            if abst is not None:
                found[ABSTENTION] = abst
    missing = [t for t in (*LONGMEMEVAL_TYPES, ABSTENTION) if t not in found]
    if missing:
        raise ConfigError(
            f"{src.where()}: {LONGMEMEVAL_FUNCTION} in {LONGMEMEVAL_FILE} at "
            f"{S.describe_commit(src)} has no template for {missing}"
        )
    commit = S.resolved_commit(src)
    out: dict[str, OfficialText] = {}
    for kind, tpl in found.items():
        fields = [f for _, f, _, _ in string.Formatter().parse(tpl) if f is not None]
        if fields != ["", "", ""]:
            raise ConfigError(
                f"{src.where()}: the {kind} template of {LONGMEMEVAL_FUNCTION} is not filled with "
                f"three positional fields (question, answer, response): {fields}"
            )
        out[kind] = OfficialText("longmemeval", LONGMEMEVAL_FILE,
                                 f"{LONGMEMEVAL_FUNCTION}[{kind}]", tpl, commit)
    return out


def longmemeval_template(texts: Mapping[str, OfficialText], question_type: str,
                         is_abstention: bool) -> OfficialText:
    """evaluate_qa.py's choice: the abstention template for `_abs` questions, else by type."""
    key = ABSTENTION if is_abstention else question_type
    if key not in texts:
        raise ConfigError(
            f"prompts.sources.longmemeval: get_anscheck_prompt has no template for question "
            f"type {question_type!r} (it raises NotImplementedError there)"
        )
    return texts[key]


def records(texts: Mapping[str, OfficialText]) -> dict[str, Any]:
    """Manifest material: per text its file, variable, commit and hash (never the text)."""
    return {k: t.record() for k, t in sorted(texts.items())}


def _texts_of(name: str, spec: str) -> dict[str, OfficialText]:
    """Every text source `name` supplies, by use; raises ConfigError on the first absent one."""
    if name == "lightmem":
        out = build_texts(spec)
        out.update({f"reader[{n}]": lightmem_reader(spec, n) for n in READERS})
        judge = locomo_judge(spec, None)
        assert judge is not None
        out["judge_locomo"] = judge
        # Only the update stage needs it (and stops naming it where it is absent).
        if UPDATE_NAME in S.string_constants(_src(name, spec), LIGHTMEM_FILES[UPDATE_NAME]):
            out["update"] = lightmem_update(spec)
        return out
    if name == "mem0":
        judge = locomo_judge(None, spec)
        assert judge is not None
        return {"judge_locomo": judge}
    return {f"judge_longmemeval[{k}]": t for k, t in longmemeval_judges(spec).items()}


def manifest(job: JobConfig) -> dict[str, Any] | None:
    """The run header's `official_texts`: per configured source its spec, resolved commit and
    the file/variable/hash of each text it supplies (an absent text is named with the reason;
    the stage that needs it stops with that ConfigError). None when no source is set."""
    out: dict[str, Any] = {}
    for name in SOURCE_NAMES:
        spec = source_spec(job, name)
        if spec is None:
            continue
        src = _src(name, spec)
        entry: dict[str, Any] = {"spec": spec, "commit": S.resolved_commit(src)}
        try:
            entry["texts"] = records(_texts_of(name, spec))
        except ConfigError as e:  # recorded, not hidden: the manifest says what is missing
            entry["incomplete"] = str(e)
        out[name] = entry
    if out.get("mem0") and out.get("lightmem"):
        out["judge_locomo_from"] = "mem0"
    return out or None


def texts_protocol(job: JobConfig) -> str:
    """The report's `protocols.texts`: which official checkouts (at which commit) the run's
    texts came from, e.g. "official: lightmem@8fc9a91, mem0@b3ede5b; ours: longmemeval", or
    "ours" when every prompts.sources.* is null (our own wording)."""
    official, ours = [], []
    for name in SOURCE_NAMES:
        spec = source_spec(job, name)
        if spec is None:
            ours.append(name)
            continue
        commit = S.resolved_commit(_src(name, spec))
        official.append(f"{name}@{commit[:7] if commit else 'work tree'}")
    if not official:
        return "ours"
    return "official: " + ", ".join(official) + (f"; ours: {', '.join(ours)}" if ours else "")


def fingerprint(texts: Mapping[str, OfficialText | None]) -> str | None:
    """Stage fingerprint material: the commit and hash of every official text a stage uses."""
    used = {k: (t.commit, t.digest) for k, t in sorted(texts.items()) if t is not None}
    return stable_hash(used) if used else None


def judge_texts(job: JobConfig) -> dict[str, OfficialText | None]:
    """The official judge texts this config names (LoCoMo judge; LongMemEval by type)."""
    out: dict[str, OfficialText | None] = {
        "judge_locomo": locomo_judge(source_spec(job, "lightmem"), source_spec(job, "mem0"))
    }
    lme = source_spec(job, "longmemeval")
    if lme is not None:
        out.update({f"judge_longmemeval[{k}]": t for k, t in longmemeval_judges(lme).items()})
    return out
