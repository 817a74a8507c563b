"""Mem0^g: mem0 with its Kùzu graph store (the registry looks up `SPEC` by module name)."""

from structmem_gpu.systems.mem0 import GRAPH_SPEC as SPEC

__all__ = ["SPEC"]
