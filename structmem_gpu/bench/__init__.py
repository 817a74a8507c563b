"""Performance and scale harness behind `jobs/bench.py` (throughput, overhead, cost, scale).

    python jobs/bench.py                 # default CPU suite -> <bench dir>/bench.json + bench.md
    python jobs/bench.py llm schedule    # selected parts only
    python jobs/bench.py --tiny          # CI smoke configuration (asserts keys, never timings)

Modules: `suite` (orchestration, output files), `harness` (config composition, server,
schedule/encoder injection), `llm_bench`, `build` (build + schedule), `components`, `cost`,
`scale` + `scale_worker`, `synthetic` (LoCoMo-format generator), `fit`, `dry_run`, `report`.
Nothing here is imported by the pipeline; the benchmark is never a test.
"""
