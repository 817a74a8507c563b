"""One thread for a native library's pool, for one block of code.

    with one_thread("openmp"):      # igraph's PRPACK: one summation order, reproducible scores
        ...
    with one_thread("blas"):        # many small numpy products: no idle worker spinning
        ...

threadpoolctl finds the libraries loaded when a pool kind is first asked for, so ask after the
library is loaded (igraph's OpenMP: after the first graph is built). The limit is lifted when
the block ends; other pools (the encoder's) are untouched.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _pools(user_api: str) -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api=user_api)


def one_thread(user_api: str) -> Any:
    """Context manager: the `user_api` ("openmp", "blas") pools run one thread inside it."""
    return _pools(user_api).limit(limits=1)
