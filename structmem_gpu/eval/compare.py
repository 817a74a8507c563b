"""Moved to structmem_gpu.analysis.compare (notebook-side analysis, no pipeline stage).

This name is an alias of that module, so `from structmem_gpu.eval.compare import ...` and
`import structmem_gpu.eval.compare` keep working and patch the same module object.
"""

import sys

from structmem_gpu.analysis import compare as _moved

sys.modules[__name__] = _moved
