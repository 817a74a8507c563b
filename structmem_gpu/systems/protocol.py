"""The JSON-lines protocol between a job and a baseline system's worker process.

A baseline memory system (Mem0, LightRAG, ...) runs from its own released code in its own
virtual environment (systems/envs.py): its pins conflict with ours and with each other. The
job starts `<env>/bin/python structmem_gpu/systems/workers/<system>_worker.py` as a child
process; the worker imports nothing of this package (only the standard library, the system's
own package and `structmem_gpu/systems/workers/worker_common.py`, which sits beside it) and
speaks one JSON object per line: requests on its stdin, replies on its stdout. Its logging
goes to stderr, which the job writes to `logs/system_<name>_<n>.log`.

Every LLM and embedding call of the system goes to the job's recording front
(systems/front.py) through the `base_url` of each request: the URL path carries the system,
phase and unit (`/u/<system>/<phase>/<unit>/v1`), so the front attributes every call
without the system's cooperation.

Requests (job -> worker) and replies (worker -> job), one line each:

    {"op": "hello", "system": "mem0", "settings": {...}, "clock": "2023-05-08T13:56:00"}
    -> {"op": "ready", "system": "mem0", "version": "1.0.5"}

    {"op": "build", "unit": "conv-26", "base_url": "http://127.0.0.1:PORT/u/mem0/build/conv-26/v1",
     "model": "<served name>", "embed_model": "<encoder id>", "embed_dims": 384,
     "store_dir": "<run>/systems/mem0/store/conv-26",
     "speakers": ["Caroline", "Melanie"], "speaker_a": "Caroline", "speaker_b": "Melanie",
     "sessions": [{"session_index": 1, "session_time": "2023-05-08T13:56:00",
                   "turns": [{"event_id": "conv-26:D1:1", "speaker": "Caroline", "text": "...",
                              "raw_text": "...", "image_caption": null}]}]}
    -> {"op": "built", "unit": "conv-26",
        "memories": [{"memory_id": "...", "owner": "Caroline", "text": "...",
                      "created_at": "2023-05-08T13:56:00", "metadata": {...}}],
        "calls": 12, "dropped": 1, "drops": [{"where": "facts", "why": "reply not JSON"}]}

    {"op": "search", "unit": "conv-26", "base_url": ".../u/mem0/search/conv-26/v1",
     "model": ..., "embed_model": ..., "embed_dims": 384, "store_dir": ..., "speakers": [...],
     "questions": [{"question_id": "conv-26:q0", "question": "..."}], "k": 10}
    -> {"op": "found", "unit": "conv-26",
        "results": {"conv-26:q0": [{"memory_id": "...", "owner": "Caroline", "text": "...",
                                     "created_at": "...", "score": 0.61}]},
        "readers": {"conv-26:q0": "<prompt>"}}   # optional: the system's own reader prompt

    any request that fails -> {"op": "error", "unit": "conv-26", "error": "<type>: <message>",
                               "log_tail": "<last lines of the worker's log>"}
    {"op": "exit"} -> the worker exits 0.

`speakers` lists the conversation's speakers in order of appearance; `speaker_a` and
`speaker_b` (build only, absent for a run loaded before the load stage's conversations table)
are the benchmark's two roles, LoCoMo's named speaker_a / speaker_b (not always the first to
speak: conv-30's Gina speaks before its speaker_a Jon) and LongMemEval's user / assistant, for
a system's own driver that pairs or names turns by role (MemoryOS's pages).

A turn's `text` has its image caption inline ("... [image: <caption>]"); `raw_text` and
`image_caption` are the two apart, for a system's own LoCoMo driver that renders the caption
its way (LightMem's "(image description: ...)").

`settings` is the system's settings block (conf/method/<system>.yaml `system.options`) plus
the paper's retrieval depth; `clock` is the instant the worker freezes `datetime.now()` at
(before the system is imported), so prompts that embed today's date are the same on every
rerun and the response cache hits. `readers` (optional) is the prompt the system's own QA
harness would send for each question (LightMem's search_locomo builds one from what it
retrieved): the search stage keeps it in `system_readers`, and
`answer.prompt=structmem_gpu.systems.answer:own_reader` sends it. `dropped` counts the memories the system lost on this unit
(an unparseable or empty model reply it swallowed), `drops` says where and why.
"""

from __future__ import annotations

PROTOCOL_VERSION = "1"

OPS_IN = ("hello", "build", "search", "exit")
OPS_OUT = ("ready", "built", "found", "error")


def unit_url(front_url: str, system: str, phase: str, unit: str) -> str:
    """The base URL a worker gives the system for one unit: the front attributes by path."""
    from urllib.parse import quote

    return f"{front_url.rstrip('/')}/u/{quote(system, safe='')}/{phase}/{quote(unit, safe='')}/v1"
