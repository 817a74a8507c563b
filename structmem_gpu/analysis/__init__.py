"""Notebook-side analysis of finished runs: read, join, compare and plot run directories.

    from structmem_gpu.analysis.inspect import load_run, answers_table, question_view

Modules: run (Run, answers table), provenance (per-question / per-conversation views),
inspect (sweeps; re-exports the two), compare (one row per run), agreement (judge kappas),
curves (frames behind the figures), plots (PNG figures; the only matplotlib import).

Rule: nothing here imports a pipeline stage (structmem_gpu.eval.answer / judge / report /
audit_*, structmem_gpu.methods), so the analysis can never change what a run computes; it
reads the run directory contract and the shared, stage-free helpers (eval.published,
eval.recall, eval.bootstrap). The old paths structmem_gpu.eval.<module> are aliases of
these modules, kept for existing notebooks and scripts.
"""
