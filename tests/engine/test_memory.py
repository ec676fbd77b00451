import ctypes
import os
import subprocess
import sys

import pytest

PROBE = """
import ctypes, numpy as np
from dpfl.training.memory import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
on = keep_freed_memory()
before = libc.mallinfo2().hblkhd
a = np.ones(64 << 20, np.uint8)
mapped = libc.mallinfo2().hblkhd - before
del a
print(on, mapped >= 64 << 20, libc.mallinfo2().fordblks >= 64 << 20)
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc_with_mallinfo2(), reason="needs glibc ≥ 2.33")
@pytest.mark.parametrize("setting,want", [({}, "True False True"), ({"DPFL_KEEP_FREED_MEMORY": "0"}, "False True False"),
                                          ({"MALLOC_TOP_PAD_": "0"}, "False True False")])
def test_keep_freed_memory_serves_large_blocks_from_the_heap_and_keeps_them(setting, want):
    """In effect, a 64 MB block comes from the heap (not mmap) and stays there once freed; with
    DPFL_KEEP_FREED_MEMORY=0, or glibc's own MALLOC_* set by the user, glibc maps it and unmaps it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "DPFL_KEEP_FREED_MEMORY"}
    env.update(setting)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == want.split()


def test_an_unknown_setting_is_an_error(monkeypatch):
    from dpfl.errors import ConfigError
    from dpfl.training.memory import keep_freed_memory

    monkeypatch.setenv("DPFL_KEEP_FREED_MEMORY", "yes")
    with pytest.raises(ConfigError, match="must be 0 or 1, got 'yes'"):
        keep_freed_memory()
