"""Moved to structmem_gpu.analysis.provenance (notebook-side analysis, no pipeline stage).

This name is an alias of that module, so `from structmem_gpu.eval.provenance import ...` and
`import structmem_gpu.eval.provenance` keep working and patch the same module object.
"""

import sys

from structmem_gpu.analysis import provenance as _moved

sys.modules[__name__] = _moved
