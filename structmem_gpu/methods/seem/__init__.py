"""SEEM (Structured Episodic Event Memory, arXiv 2601.06411) as stages over the shared plumbing.

    python jobs/run.py method=seem                      # sample benchmark, CPU profile
    python jobs/run.py -m experiment=seem_ablations     # paper Table 3 switches

Stages (docs/methods.md, sections "SEEM: ..."): load -> frames (F_ext, passages.py/frames.py) ->
fusion (wavefront, fusion.py/store.py/fusion_requests.py) -> graph
(quadruples.py/entities.py/graph_build.py/graph.py) -> retrieve
(memory.py/ranking.py/retrieve.py) -> answer (shared stage, context.py) -> judge -> report.
Tables: schemas.py.
"""
