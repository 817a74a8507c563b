"""bench.md: the tables of bench.json, one section per part.

python jobs/bench.py            # writes <bench dir>/bench.json and bench.md
render_markdown(json.loads(Path("bench.json").read_text()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.01:
            return f"{v:.2e}"
        return f"{v:,.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "_(no rows)_"
    head = "| " + " | ".join(columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def _error(part: Mapping[str, Any]) -> str | None:
    return f"**failed:** {part['error']}" if "error" in part else None


def _llm(p: Mapping[str, Any]) -> list[str]:
    return [
        md_table(
            p["rows"],
            [
                "mode",
                "in_flight",
                "requests",
                "wall_s",
                "requests_per_s",
                "output_tokens_per_s",
                "mean_latency_s",
                "overhead_ms_per_request",
                "errors",
                "unparsed",
                "wall_s_rounds",
            ],
        ),
        f"\nClient overhead: {_fmt(p['client_overhead_ms_per_request'])} ms/request outside HTTP "
        f"(client x1); client x1 - raw: {_fmt(p['client_minus_raw_ms_per_request'])} ms/request; "
        f"batched vs raw speed-up: {_fmt(p['batched_speedup_vs_raw'])}x (replies capped at "
        f"{p['max_tokens']} tokens, so replies may not parse: they count for throughput all "
        f"the same; raw and client x1: fastest of {p.get('rounds', 1)} alternating rounds).",
    ]


def _client(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    from structmem_gpu.bench.client_bench import TARGET_CPU_RATIO, TARGET_RPS_AT_256, verdict

    v = verdict(rows)
    cols = ["in_flight", "cache", "requests", "requests_per_s", "client_cpu_ms_per_request"]
    return [
        md_table(rows, [*cols, "errors", "loadavg_1m"]),
        f"\nTarget (>= {TARGET_RPS_AT_256:,.0f} req/s at 256 in flight without the cache, CPU per "
        f"request within {TARGET_CPU_RATIO}x of 8 in flight): "
        f"{'met' if v['meets_target'] else 'NOT met' if v['meets_target'] is False else '-'} "
        f"({', '.join(f'{k} {_fmt(x)}' for k, x in v.items() if k != 'meets_target')}).",
    ]


def _build(p: Mapping[str, Any]) -> list[str]:
    rows = [*p["stages"], {"stage": "**total**", **p["total"]}]
    t = p["total"]
    return [
        md_table(
            rows,
            [
                "stage",
                "calls",
                "prompt_tokens",
                "completion_tokens",
                "wall_s",
                "llm_wall_s",
                "encoder_wall_s",
                "index_wall_s",
                "overhead_share",
                "requests_per_s",
                "output_tokens_per_s",
                "embeddings_per_s",
            ],
        ),
        f"\nFramework overhead (wall time outside the LLM server, the encoder and FAISS): "
        f"{_fmt(t['overhead_s'])} s = {_fmt(t['overhead_share'])} of {_fmt(t['wall_s'])} s; "
        f"target < {_fmt(p['overhead_target'])}: {'met' if p['meets_target'] else 'NOT met'}. "
        f"torch and sentence-transformers were imported before the run "
        f"({_fmt(p.get('encoder_import_s'))} s, a one-time process cost not counted); the "
        f"encoder's model load counts as encoder time.",
    ]


def _schedule(p: Mapping[str, Any]) -> list[str]:
    rows = [{"schedule": k, **p[k]} for k in ("batched", "reference")]
    diff = p["differences"]
    per = ", ".join(
        f"{s}: {v['differing']} differing / {v['matched']} matched, {v['unmatched']} unmatched"
        for s, v in diff.items()
        if isinstance(v, dict)
    )
    return [
        md_table(
            rows,
            [
                "schedule",
                "wall_s",
                "llm_stages_wall_s",
                "requests",
                "completion_tokens",
                "requests_per_s",
                "output_tokens_per_s",
                "loadavg_start_end",
            ],
        ),
        f"\nRatio reference / batched: **{_fmt(p['ratio'])}x** (stages {', '.join(p['stages'])}); "
        f"LLM stages only: {_fmt(p['llm_stages_ratio'])}x; "
        f"batched max_in_flight={p['max_in_flight']}. Replies: {per}.",
    ]


def _components(p: Mapping[str, Any]) -> list[str]:
    return [
        "Encoder:\n",
        md_table(
            p["encoder"],
            ["device", "model", "texts", "batch_size", "load_s", "wall_s", "embeddings_per_s"],
        ),
        "\nFAISS (flat IP, one index per conversation):\n",
        md_table(
            p["faiss"],
            [
                "device",
                "indexes",
                "vectors_per_index",
                "dim",
                "k",
                "build_s",
                "build_vectors_per_s",
                "queries",
                "queries_per_s",
            ],
        ),
        "\nParquet (entries table, zstd):\n",
        md_table(
            [p["parquet"]],
            [
                "rows",
                "file_mb",
                "in_memory_mb",
                "write_rows_per_s",
                "write_mb_per_s",
                "read_rows_per_s",
                "read_mb_per_s",
            ],
        ),
    ]


def _cost(p: Mapping[str, Any]) -> list[str]:
    ex = p["extrapolation"]
    paper = p["paper_table1"]
    total = ex["build_total"]
    cmp_rows = [
        {"what": "ours, extrapolated", **total},
        {
            "what": "paper Table 1",
            **{k: paper[k] for k in ("calls", "prompt_tokens", "completion_tokens")},
        },
        {
            "what": "ours / paper",
            **{
                k: ex["build_vs_paper"][f"{k}_ratio"]
                for k in ("calls", "prompt_tokens", "completion_tokens")
            },
        },
    ]
    out = [
        f"Source: `{p['run_dir']}` ({p['conversations']} conversations, {p['turns']} turns, "
        f"{p['questions_answered']} questions answered).\n",
        md_table(
            p["per_stage"],
            [
                "stage",
                "calls",
                "cache_hits",
                "prompt_tokens",
                "completion_tokens",
                "cached_tokens",
                "truncated",
            ],
        ),
        "\nPer conversation:\n",
        md_table(
            p["per_conversation"],
            ["conv_id", "stage", "calls", "prompt_tokens", "completion_tokens"],
        ),
        f"\nExtrapolated to {ex['target']}:\n",
        md_table(
            ex["per_stage"],
            ["stage", "basis", "factor", "calls", "prompt_tokens", "completion_tokens"],
        ),
        "\nBuild (LLM stages before answer) next to the paper:\n",
        md_table(cmp_rows, ["what", "calls", "prompt_tokens", "completion_tokens"]),
    ]
    out += [f"\n- {n}" for n in p.get("notes", [])]
    return out


def _scale(p: Mapping[str, Any]) -> list[str]:
    out = []
    s = p["scripted"]
    out.append(
        f"Scripted LLM, encoder `{s['encoder']}`, {s['spec']['sessions']} sessions x "
        f"{s['spec']['turns_per_session']} turns per conversation:\n"
    )
    out.append(
        md_table(
            s["fit"],
            [
                "stage",
                "sizes",
                "wall_s",
                "s_per_conversation",
                "slope_s_per_conversation",
                "intercept_s",
                "r2",
                "growth_exponent",
                "marginal_ratio",
                "peak_rss_mb",
            ],
        )
    )
    out.append(
        "\ngrowth_exponent: log-log slope between the two largest sizes (1.0 = linear); "
        "marginal_ratio: seconds per added conversation at the large end / at the small end."
    )
    errors = [
        f"{pt['conversations']}: {pt['result']['error']}"
        for pt in s["points"]
        if "error" in pt["result"]
    ]
    if errors:
        out.append("\nFailed sizes: " + "; ".join(errors))
    r = p.get("real_llm", {})
    if "fit" in r:
        out += [
            "\nReal LLM server (small slice, 1 session x 4 turns per conversation):\n",
            md_table(
                r["fit"], ["stage", "sizes", "wall_s", "s_per_conversation", "growth_exponent"]
            ),
        ]
    elif r:
        out.append(f"\nReal LLM slice skipped: {r.get('skipped') or r.get('error')}")
    h = p.get("haystack", {})
    if h and "error" not in h:
        out += [
            "\nShared sessions (LongMemEval-style haystacks), extract stage:\n",
            md_table(
                [h],
                [
                    "conversations",
                    "sessions_per_conversation",
                    "pool",
                    "unique_sessions",
                    "requests",
                    "unique_requests",
                    "sent",
                    "saved",
                    "saved_share",
                ],
            ),
            f"\nDeduplicated by: {h['dedup_by']}.",
        ]
    return out


def _dry_run(p: Mapping[str, Any]) -> list[str]:
    out = []
    for name, est in p.items():
        if not isinstance(est, dict) or "stages" not in est:
            out.append(f"- {name}: {est}")
            continue
        out += [
            f"\n{name}: method `{est['method']}`, benchmark `{est['benchmark']}` "
            f"({est['conversations']} conversations, {est['turns']} turns, "
            f"{est['questions_selected']} questions), tokens by {est['tokenizer']}:\n",
            md_table(  # bound: an upper bound (the stage's requests depend on replies)
                [*est["stages"], {"stage": "total", **est["total"], "bound": est.get("bound")}],
                ["stage", "requests", "bound", "prompt_tokens", "completion_tokens", "basis"],
            ),
        ]
    return out


def _lme_load(part: Mapping[str, Any]) -> list[str]:
    from structmem_gpu.bench.lme_load import render

    return render(dict(part))


def _lme_groups(part: Mapping[str, Any]) -> list[str]:
    from structmem_gpu.bench.lme_groups import render

    return render(dict(part))


def _lme_count(part: Mapping[str, Any]) -> list[str]:
    from structmem_gpu.bench.lme_count import render

    return render(list(part.get("rows", [])))


def _paced(part: Mapping[str, Any]) -> list[str]:
    rows = [r for r in part.get("rows", []) if "error" not in r]
    out = [f"{part.get('simulation', '')}\n",
           md_table(rows, ["build", "size", "time_scale", "requests", "wall_s", "busy_fraction",
                           "wave_limited_share", "saturated_share", "engine_model_s",
                           "idle_real_s", "predicted_gpu_s"])]
    phases = [{"build": r["build"], "size": r["size"], "phase": name, **ph}
              for r in rows for name, ph in (r.get("phases") or {}).items()]
    if phases:
        out += ["\nper phase (build = the memory build; evaluation = retrieve, answer, judge):\n",
                md_table(phases, ["build", "size", "phase", "wall_s", "busy_fraction",
                                  "wave_limited_share", "engine_model_s", "idle_real_s",
                                  "predicted_gpu_s"])]
    for r in rows:
        out += [f"\n{r['build']} / {r['size']} per stage:\n",
                md_table(r["stages"], ["stage", "wall_s", "requests", "cpu_ms_per_request",
                                       "client_cpu_ms_per_request",
                                       "busy_fraction", "wave_limited_share"])]
    out += [f"\n{r['build']} / {r['size']}: error {r['error']}\n"
            for r in part.get("rows", []) if "error" in r]
    return out


SECTIONS = (
    ("client", "LLM client ceiling (zero-latency mock server)", _client),
    ("llm", "LLM client throughput and overhead", _llm),
    ("build", "Build cost per stage", _build),
    ("schedule", "Batched vs reference schedule", _schedule),
    ("components", "Component throughput", _components),
    ("cost", "LLM cost", _cost),
    ("scale", "Scale", _scale),
    ("dry_run", "Dry-run estimates", _dry_run),
    ("lme_count", "LongMemEval file: occurrences and distinct sessions", _lme_count),
    ("lme_load", "LongMemEval-M-shaped load (bounded memory)", _lme_load),
    ("lme_groups", "LongMemEval-M-shaped scripted builds, question-grouped (bounded memory)",
     _lme_groups),
    ("paced", "GPU-paced builds (simulation)", _paced),
)


def render_markdown(bench: Mapping[str, Any]) -> str:
    meta = bench.get("meta", {})
    lines = [
        "# structmem-gpu benchmark",
        "",
        f"Profile `{meta.get('profile')}`{' (tiny)' if meta.get('tiny') else ''}, started "
        f"{meta.get('started')}, total wall time {_fmt(meta.get('wall_s'))} s on "
        f"{meta.get('cpus')} CPUs (load average {_fmt(meta.get('loadavg_start'))} -> "
        f"{_fmt(meta.get('loadavg_end'))}; other LLM servers running on this machine: "
        f"{meta.get('other_llm_servers')}). LLM: {meta.get('llm')}. "
        f"Overrides: `{' '.join(meta.get('overrides', [])) or '-'}`.",
    ]
    if meta.get("notes"):
        lines += [f"- {n}" for n in meta["notes"]]
    for key, title, fn in SECTIONS:
        if key not in bench:
            continue
        part = bench[key]
        lines += ["", f"## {title}", ""]
        if isinstance(part, Mapping) and "skipped" in part:
            lines.append(f"_skipped: {part['skipped']}_")
            continue
        err = _error(part) if isinstance(part, Mapping) else None
        lines += [err] if err else fn(part)
    return "\n".join(lines) + "\n"
