"""Independent parts of a job run across threads, on one shared pool.

NumPy, torch and the C kernels release the GIL, so parts that write disjoint outputs run on all
the cores torch was given (`run.threads`): contiguous blocks of rows or columns (`for_blocks`), or
items handed out one at a time (`for_each`). Each part computes what a serial loop would, so
results do not depend on the number of threads. A call made from inside a part runs serially.
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
    """A pool of at least n threads (it only grows: callers asking for fewer share it). Call with
    `_lock` held, and submit before releasing it, so no other caller shuts the pool down between."""
    global _pool, _pool_size
    if _pool is None or _pool_size < n:
        if _pool is not None:
            _pool.shutdown(wait=False)  # what was queued on it still runs
        _pool = ThreadPoolExecutor(n, thread_name_prefix="dpfl-blocks", initializer=_mark_inside)
        _pool_size = n
    return _pool


def _mark_inside() -> None:
    _inside.flag = True


def _forget_pool() -> None:  # a forked child has none of the parent's threads, and no lock holder
    global _pool, _pool_size, _lock
    _pool, _pool_size, _lock = None, 0, threading.Lock()
    _inside.flag = False


os.register_at_fork(after_in_child=_forget_pool)


def _inside_part() -> bool:
    return getattr(_inside, "flag", False)


def _together(calls: list[Callable[[], None]]) -> None:
    """Run the calls at once, the first on the calling thread; re-raise the first error once all
    have finished."""
    with _lock:
        pool = _get_pool(len(calls) - 1)
        futures = [pool.submit(c) for c in calls[1:]]
    errors: list[BaseException] = []
    _inside.flag = True  # the caller's own part nests serially too
    try:
        calls[0]()
    except BaseException as e:  # noqa: BLE001 (re-raised below, after the others finish)
        errors.append(e)
    finally:
        _inside.flag = False
    for f in futures:
        e = f.exception()
        if e is not None:
            errors.append(e)
    if errors:
        raise errors[0]


def for_blocks(n: int, fn: Callable[[int, int], None], min_block: int = 1) -> None:
    """Call fn(start, stop) on contiguous blocks covering range(n), one block per thread, each at
    least `min_block` long; returns once all are done and re-raises the first block's error."""
    w = workers()
    k = min(w, n // max(1, min_block)) if n > 0 else 0
    if k <= 1 or _inside_part():
        if n > 0:
            fn(0, n)
        return
    bounds = [n * j // k for j in range(k + 1)]
    _together([lambda a=bounds[j], b=bounds[j + 1]: fn(a, b) for j in range(k)])


def for_each(n: int, fn: Callable[[int], None], threads: int | None = None) -> None:
    """Call fn(i) for every i in range(n), indices handed out one at a time (uneven items balance)
    to `threads` threads (default: `workers()`); after an error no further index is handed out, and
    the first error is re-raised once the running calls finish."""
    k = min(workers() if threads is None else max(1, int(threads)), n)
    if k <= 1 or _inside_part():
        for i in range(n):
            fn(i)
        return
    todo, lock, failed = iter(range(n)), threading.Lock(), threading.Event()

    def drain() -> None:
        while not failed.is_set():
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                fn(i)
            except BaseException:
                failed.set()
                raise

    try:
        _together([drain] * k)
    finally:  # also on an interrupt while waiting: no index is handed out after this call returns
        failed.set()
