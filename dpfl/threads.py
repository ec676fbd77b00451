"""Independent blocks of an array job run across threads.

NumPy releases the GIL inside its loops, so contiguous blocks of rows (or columns) that write
disjoint outputs run on all the cores torch was given (`run.threads`). Each block computes the
same values as a serial loop would, so results do not depend on the number of threads.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()
_inside = threading.local()  # set in pool threads: nested calls run serially (no deadlock)


def workers() -> int:
    """Threads to use: torch's intra-op thread count (1 if torch is not loaded)."""
    torch = sys.modules.get("torch")
    return max(1, int(torch.get_num_threads())) if torch is not None else 1


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(n, thread_name_prefix="dpfl-blocks", initializer=_mark_inside)
            _pool_size = n
        return _pool


def _mark_inside() -> None:
    _inside.flag = True


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _pool, _pool_size
    _pool, _pool_size = None, 0


os.register_at_fork(after_in_child=_forget_pool)


def for_blocks(n: int, fn: Callable[[int, int], None], min_block: int = 1) -> None:
    """Call fn(start, stop) on contiguous blocks covering range(n), one block per thread, each at
    least `min_block` long; returns once all are done and re-raises the first block's error."""
    w = workers()
    k = min(w, n // max(1, min_block)) if n > 0 else 0
    if k <= 1 or getattr(_inside, "flag", False):
        if n > 0:
            fn(0, n)
        return
    bounds = [n * j // k for j in range(k + 1)]
    futures = [_get_pool(w - 1).submit(fn, bounds[j], bounds[j + 1]) for j in range(1, k)]
    errors: list[BaseException] = []
    try:
        fn(bounds[0], bounds[1])  # the calling thread takes the first block
    except BaseException as e:  # noqa: BLE001 (re-raised below, after the others finish)
        errors.append(e)
    for f in futures:
        e = f.exception()
        if e is not None:
            errors.append(e)
    if errors:
        raise errors[0]
