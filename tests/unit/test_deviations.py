"""Listed deviations (structmem_gpu/analysis/deviations.py): a difference of a request-level
differential is explained only by a deviation listed for its stage, and anything else — other
message text, another setting, a request one run alone sent — is reported unexplained."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl

from structmem_gpu.analysis.deviations import DEVIATIONS, explain
from structmem_gpu.analysis.differential import Differential, Pair, StageDiff
from structmem_gpu.analysis.differential_sources import Recorded

RECORDS = "[{t}, Sun] Tomas: adopted a beagle\n[{u}, Sun] Lena: ran 16 km"


def _rec(rid: str, stage: str, user: str) -> Recorded:
    canon = json.dumps([{"role": "system", "content": "Summarise."},
                        {"role": "user", "content": user}])
    return Recorded(rid, stage, "c1", rid, False, canon, user, "")


def _diff(stage: str, official: str, port: str, off_params: str, port_params: str,
          tmp: Path, method: str = "lightmem_official") -> Differential:
    (tmp / "official").mkdir(exist_ok=True)
    (tmp / "official" / "manifest.json").write_text(json.dumps({"method": method}))
    o, p = _rec("o1", stage, official), _rec("p1", stage, port)
    s = StageDiff(stage, 1, 1, 0, pairs=[Pair(o, p, 0.9)],
                  official_params=Counter([off_params]), port_params=Counter([port_params]))
    return Differential(tmp / "official", tmp / "port", 10, [s], pl.DataFrame(),
                        pl.DataFrame(), (tmp, tmp))


def test_times_of_day_and_listed_settings_are_explained(tmp_path: Path) -> None:
    off = RECORDS.format(t="2024-03-17T19:05:00.000", u="2024-03-17T19:05:01.000")
    port = RECORDS.format(t="2024-03-17T19:05:00.000", u="2024-03-17T19:05:00.000")
    d = _diff("consolidate", off, port, "max_tokens=16000 model=gpt temperature=0.1",
              "max_tokens=1024 model=ours seed=0 temperature=0.1", tmp_path)
    ex = explain(d)
    assert ex.method == "lightmem_official" and ex.deviations == DEVIATIONS["lightmem_official"]
    assert ex.unexplained == []
    assert ex.stage("consolidate").explained == Counter(
        {"entry-times": 1, "reply-budgets": 1, "model-name": 1, "request-seed": 1})


def test_an_unlisted_difference_is_unexplained(tmp_path: Path) -> None:
    off = RECORDS.format(t="2024-03-17T19:05:00.000", u="2024-03-17T19:05:01.000")
    other_date = RECORDS.format(t="2024-03-18T19:05:00.000", u="2024-03-17T19:05:01.000")
    d = _diff("consolidate", off, other_date, "temperature=0.1", "temperature=0", tmp_path)
    assert explain(d).unexplained == [
        "consolidate: o1 <> p1: messages differ (similarity 0.900)",
        "consolidate: setting temperature: official ['0.1'] vs port ['0']"]
    # a setting listed for other stages only: the reader's schema is not a listed deviation
    d = _diff("answer", "q", "q", "temperature=0", "response_format=json_schema temperature=0",
              tmp_path)
    d.stages[0].pairs.clear()
    assert explain(d).unexplained == [
        "answer: setting response_format: official ['<unset>'] vs port ['json_schema']"]
    # a request only one run sent
    d.stages[0].unmatched_port.append(_rec("p9", "answer", "extra"))
    assert "answer: p9: sent by the port only" in explain(d).unexplained


def test_a_method_without_a_list_explains_nothing(tmp_path: Path) -> None:
    same = RECORDS.format(t="2024-03-17T19:05:00.000", u="2024-03-17T19:05:00.000")
    d = _diff("consolidate", same.replace("00.000", "01.000"), same, "", "", tmp_path,
              method="seem_skill")
    ex = explain(d)
    assert ex.deviations == () and len(ex.unexplained) == 1
