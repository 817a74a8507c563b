"""The reference build's texts against LightMem's own code (STRUCTMEM_OFFICIAL_DIR, the pinned
commit; skipped without it, tests/official_repos.py):

- each LightMem text of prompts/official.py LIGHTMEM_FILES is read from the file the official
  LoCoMo code path imports it from (add_locomo.py / search_locomo.py `from prompts import`:
  experiments/locomo/prompts.py; lightmem.py / utils.py `from lightmem.memory.prompts import`:
  the package's prompts.py), found in those files' imports, not written down again here;
- a consolidation request of the reference profile equals what LightMem's `summarize` sends
  for the same entries: its own statements (the time range, the speakers, the formatted
  records) and `call_summary_llm` run on a stand-in manager that records the messages.
"""

from __future__ import annotations

import ast
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest

from structmem_gpu.methods.structmem.prompts import reference, synthesis
from structmem_gpu.prompts import official
from structmem_gpu.prompts import sources as S
from tests import official_repos

# The official LoCoMo code path: file -> the prompts file its imports name.
CODE_PATH = {
    "experiments/locomo/add_locomo.py": ("prompts", official.LIGHTMEM_LOCOMO_PROMPTS),
    "experiments/locomo/search_locomo.py": ("prompts", official.LIGHTMEM_LOCOMO_PROMPTS),
    "src/lightmem/memory/lightmem.py": ("lightmem.memory.prompts", official.LIGHTMEM_PACKAGE_PROMPTS),
    "src/lightmem/memory/utils.py": ("lightmem.memory.prompts", official.LIGHTMEM_PACKAGE_PROMPTS),
}


def _imported(source: str, module: str) -> set[str]:
    return {a.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module == module for a in node.names}


def test_each_text_is_read_from_the_file_the_official_code_imports_it_from() -> None:
    found: dict[str, set[str]] = {}
    for file, (module, prompts_file) in CODE_PATH.items():
        for name in _imported(official_repos.show("lightmem", file), module):
            found.setdefault(name, set()).add(prompts_file)
    assert {n: found.get(n) for n in official.LIGHTMEM_FILES} == \
        {n: {f} for n, f in official.LIGHTMEM_FILES.items()}
    # the extraction prompts add_locomo passes per --extraction_mode are among its imports
    names = {n for per_mode in official.EXTRACTION_NAMES.values() for n in per_mode.values()}
    assert names <= _imported(official_repos.show("lightmem", "experiments/locomo/add_locomo.py"),
                              "prompts")
    spec = official_repos.spec("lightmem")
    src = S.parse("prompts.sources.lightmem", spec)
    for (use, mode) in [("fact", "event"), ("relation", "event"), ("fact", "flat"), ("synthesis", "event")]:
        name = reference.prompt_name(use, mode)
        want = S.string_constant(src, official.LIGHTMEM_FILES[name], name, "")
        assert reference.reference_prompt(spec, use, mode) == want


class _Manager:
    def __init__(self) -> None:
        self.sent: list[list[dict[str, str]]] = []

    def generate_response(self, messages: list[dict[str, str]]) -> tuple[str, dict[str, int]]:
        self.sent.append(messages)
        return "summary", {}


def _summarize_statements() -> list[ast.stmt]:
    """LightMemory.summarize's statements that make the request's inputs from Cbuf and Sk."""
    tree = ast.parse(official_repos.show("lightmem", "src/lightmem/memory/lightmem.py"))
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "summarize")
    wanted = {"has_entry_type", "buffer_text", "supplementary_text", "time_range_str", "speakers"}
    out = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
           and any(isinstance(t, ast.Name) and t.id in wanted for t in n.targets)]
    assert {t.id for n in out for t in n.targets if isinstance(t, ast.Name)} == wanted
    return out


def _official_messages(buffer: list[synthesis.Record], context: list[synthesis.Record]) -> list[dict[str, str]]:
    spec = official_repos.spec("lightmem")
    src = S.parse("prompts.sources.lightmem", spec)
    package = official_repos.types.ModuleType("lightmem.memory.prompts")
    package.LoCoMo_Cross_Event_Consolidation = S.string_constant(  # type: ignore[attr-defined]
        src, official.LIGHTMEM_PACKAGE_PROMPTS, official.SYNTHESIS_NAME, "")
    stub = {"lightmem": official_repos.types.ModuleType("lightmem"),
            "lightmem.memory": official_repos.types.ModuleType("lightmem.memory"),
            "lightmem.memory.prompts": package}
    utils = ast.parse(official_repos.show("lightmem", official.LIGHTMEM_UTILS_FILE))
    keep = [n for n in utils.body if isinstance(n, ast.FunctionDef)
            and n.name in ("format_entries_for_prompt", "call_summary_llm")]
    ns: dict[str, Any] = {"List": list, "Dict": dict, "Optional": Any}

    def entry(r: synthesis.Record) -> dict[str, Any]:  # as LightMem stores one (no entry_type)
        stamp = r.time.isoformat(timespec="milliseconds")
        return {"id": stamp, "payload": {"time_stamp": stamp, "weekday": f"{r.time:%a}",
                                         "speaker_name": r.speaker, "memory": r.text,
                                         "float_time_stamp": r.time.timestamp()}}

    ns.update(Cbuf=[entry(r) for r in buffer], Sk=[entry(r) for r in context])
    manager = _Manager()
    with official_repos.stub_modules(stub):
        # the official code runs here, in the test only, to be the yardstick
        exec(compile(ast.Module(body=keep, type_ignores=[]), "<official utils>", "exec"), ns)  # noqa: S102
        for stmt in _summarize_statements():
            exec(compile(ast.Module(body=[stmt], type_ignores=[]), "<summarize>", "exec"), ns)  # noqa: S102
        ns["call_summary_llm"](manager=manager, buffer_text=ns["buffer_text"],
                               supplementary_text=ns["supplementary_text"],
                               time_range=ns["time_range_str"], speakers=ns["speakers"],
                               custom_prompt=None, token_stats=None,
                               logger=logging.getLogger("official"))
    assert len(manager.sent) == 1
    return manager.sent[0]


@pytest.mark.parametrize("with_context", [True, False])
def test_synthesis_request_equals_lightmem_summarize(with_context: bool) -> None:
    t = datetime(2023, 1, 14, 9, 10)
    buffer = [synthesis.Record(t, "Priya", "fact", "Priya applied to the farmers' market."),
              synthesis.Record(t, "Priya", "relation", "Priya shared her news with Marcus."),
              synthesis.Record(t + timedelta(seconds=1), "Marcus", "relation", "Marcus cheered."),
              synthesis.Record(t + timedelta(seconds=7), "Marcus", "fact", "Marcus plays cello.")]
    context = [synthesis.Record(t + timedelta(days=19, hours=7), "Marcus", "fact", "Marcus performed.")]
    context = context if with_context else []
    ours = reference.reference_synthesis_messages(official_repos.spec("lightmem"), buffer, context)
    theirs = _official_messages(buffer, context)
    assert [{"role": m.role, "content": m.content} for m in ours] == theirs


def _official_assign() -> Any:
    """LightMem's assign_sequence_numbers_with_timestamps (utils.py; it imports what it uses
    inside its body), lifted from the pinned source and run as it is."""
    source = official_repos.show("lightmem", "src/lightmem/memory/utils.py")
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)
              and n.name == "assign_sequence_numbers_with_timestamps")
    space: dict[str, Any] = {"List": list, "Dict": dict}
    exec(compile(ast.Module([fn], []), "utils.py", "exec"), space)  # noqa: S102 - test only
    return space["assign_sequence_numbers_with_timestamps"]


def test_batches_sent_by_one_add_memory_call_continue_numbering_and_seconds() -> None:
    """Two extraction batches released by one add_memory call (extract_list of two api calls):
    LightMem numbers their messages and steps each session's seconds over the whole call, so
    the second batch's lines start where the first's stopped (conv-26's slice on llama.cpp had
    2 of 8 extraction requests differ before the port did this)."""
    from structmem_gpu.methods.structmem.extraction_windows import TurnView

    s1, s2 = datetime(2023, 6, 9, 19, 55), datetime(2023, 5, 25, 13, 14)
    raw1, raw2 = "2023/06/09 (Fri) 19:55", "2023/05/25 (Thu) 13:14"
    turns = [(s2, raw2, "Ana", "a"), (s1, raw1, "Ben", "b"), (s1, raw1, "Ana", "c"),
             (s1, raw1, "Ben", "d"), (s1, raw1, "Ana", "e")]
    batches = [[turns[:3]], [turns[3:4], turns[4:]]]  # call: [batch [topic]], [batch [t, t]]

    def msgs(seg: list[tuple[datetime, str, str, str]]) -> list[dict[str, Any]]:
        out = []
        for when, raw, who, text in seg:
            for role, content in (("user", text), ("assistant", "")):
                out.append({"role": role, "content": content, "session_time": raw,
                            "weekday": f"{when:%a}", "speaker_name": who})
        return out

    extract_list = [[msgs(topic) for topic in batch] for batch in batches]
    _official_assign()(extract_list, offset_ms=500)
    theirs = [[f"[{m['time_stamp']}, {m['weekday']}] {m['sequence_number'] // 2}."
               f"{m['speaker_name']}: {m['content']}"
               for topic in batch for m in topic if m["role"] == "user"] for batch in extract_list]
    views = [TurnView(f"e{i}", f"D:{i}", 1, i, when, who, text)
             for i, (when, _, who, text) in enumerate(turns)]
    first = reference.render_reference_batch(views[:3], [(1, 3)]).splitlines()
    second = reference.render_reference_batch(views[3:], [(2, 1), (3, 1)], number_from=3,
                                              seconds_from=[(s2, 1), (s1, 2)]).splitlines()
    assert [x for x in first if not x.startswith("---")] == theirs[0]
    assert [x for x in second if not x.startswith("---")] == theirs[1]
    assert theirs[1][0].startswith("[2023-06-09T19:55:02.000, Fri] 3.Ben")
