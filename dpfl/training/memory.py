"""Process memory setting for simulation runs: keep freed memory instead of unmapping it.

A round allocates and frees the same large blocks every time (a cohort's float32 updates are
gigabytes). glibc serves blocks above 32 MB with mmap and unmaps them when freed, so each round's
blocks come back as fresh pages the kernel must fault in and zero again. On the 2-core VMs used
here that made signSGD's rounds ~1.6× slower (docs/RESULTS.md, table 4.2). Results are unchanged:
only speed and how much freed memory the process keeps resident change.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from dpfl.errors import ConfigError

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc <malloc.h>
_GLIBC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """glibc malloc: every block from the heap (M_MMAP_MAX = 0), and freed memory returned to the system
    only above 2 GiB free at the heap's top (M_TRIM_THRESHOLD). Once per process; returns whether it is
    in effect. Left alone where the C library is not glibc, where the user set glibc's own MALLOC_*
    variables, or with DPFL_KEEP_FREED_MEMORY=0."""
    global _applied
    setting = os.environ.get("DPFL_KEEP_FREED_MEMORY", "")
    if setting not in ("", "0", "1"):
        raise ConfigError(f"DPFL_KEEP_FREED_MEMORY must be 0 or 1, got {setting!r}")
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux") and setting != "0" \
                and not any(v in os.environ for v in _GLIBC_ENV):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                return False
            mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _applied
