"""Notebook-side analysis of finished runs: read, join, compare and plot run directories.

    from structmem_gpu.analysis.inspect import load_run, answers_table, question_view

Modules: run (Run, answers table), provenance (per-question / per-conversation views),
inspect (sweeps; re-exports the two), compare (one row per run), sweep_plots (figures of a
sweep), paired (paired tests of two runs on the same questions), seeds (build-seed replicates),
comparison_stats (both as sections of a comparison or sweep summary), tracking (finished runs
and sweeps logged to MLflow). One run's figures, the curves behind them and judge agreement are the report's, in
structmem_gpu.eval (plots, curves, agreement).

Rule: nothing in a pipeline stage imports this package, and it imports no method
(structmem_gpu.methods) and no stage runner, so the analysis can never change what a run
computes; it reads the run directory contract and eval's stage-free helpers (eval.published,
eval.recall, eval.bootstrap, eval.curves, eval.plots, eval.agreement). tests/unit/test_layers.py
checks it.
"""
