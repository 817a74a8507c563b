"""Moved to structmem_gpu.analysis.agreement (notebook-side analysis, no pipeline stage).

This name is an alias of that module, so `from structmem_gpu.eval.agreement import ...` and
`import structmem_gpu.eval.agreement` keep working and patch the same module object.
"""

import sys

from structmem_gpu.analysis import agreement as _moved

sys.modules[__name__] = _moved
