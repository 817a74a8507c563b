"""Moved to structmem_gpu.analysis.plots (notebook-side analysis, no pipeline stage).

This name is an alias of that module, so `from structmem_gpu.eval.plots import ...` and
`import structmem_gpu.eval.plots` keep working and patch the same module object.
"""

import sys

from structmem_gpu.analysis import plots as _moved

sys.modules[__name__] = _moved
