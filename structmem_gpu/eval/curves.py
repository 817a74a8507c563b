"""Moved to structmem_gpu.analysis.curves (notebook-side analysis, no pipeline stage).

This name is an alias of that module, so `from structmem_gpu.eval.curves import ...` and
`import structmem_gpu.eval.curves` keep working and patch the same module object.
"""

import sys

from structmem_gpu.analysis import curves as _moved

sys.modules[__name__] = _moved
