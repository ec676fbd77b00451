"""Checkpoint files: plain data only, written atomically, read without running code.

A checkpoint holds dicts, lists, tuples, strings, numbers, None and tensors. numpy arrays and
scalars are stored as tagged dicts (`{"__numpy__": ...}`) and rebuilt on load, so `torch.load`
runs with `weights_only=True`: a crafted file cannot execute code. Checkpoints written before
this format (pickled numpy arrays) are read with numpy's array types allow-listed, still under
`weights_only=True`, and are rewritten in this format at the next save.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.errors import DataError

FORMAT = 2  # 1: the old pickles (no "format" key)
# what torch.load raises on a truncated or garbage file
_CORRUPT = (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError,
            UnicodeDecodeError, OverflowError, MemoryError)
_TAG = "__numpy__"


def to_plain(obj: Any, where: str = "state") -> Any:
    """`obj` with numpy values replaced by tagged dicts; TypeError names anything else non-plain."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: numpy object arrays cannot go into a checkpoint")
        return {_TAG: "array", "dtype": obj.dtype.str, "data": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return {_TAG: "scalar", "dtype": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, dict):
        if _TAG in obj:
            raise TypeError(f"{where}: the key {_TAG!r} is reserved")
        return {k: to_plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else tuple(out)
    raise TypeError(f"{where}: a {type(obj).__name__} cannot go into a checkpoint (plain data only)")


def from_plain(obj: Any) -> Any:
    """Inverse of `to_plain`."""
    if isinstance(obj, dict):
        kind = obj.get(_TAG)
        if kind == "array":
            return obj["data"].numpy().astype(np.dtype(obj["dtype"]), copy=True)
        if kind == "scalar":
            return np.dtype(obj["dtype"]).type(obj["value"])
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj


def save(state: dict[str, Any], path: str | Path) -> None:
    """Write `state` to `path` atomically: a temporary file, fsync, rename. A crash leaves the old file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:  # it may hold a noise key
        torch.save({"format": FORMAT, **to_plain(state)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_text(path: str | Path, text: str) -> None:
    """Atomic text write (same steps as `save`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _legacy_globals() -> list:
    """numpy's array, scalar and dtype types, under numpy 2's and numpy 1's module names: what format-1
    checkpoints pickled (local-noise participation counts). None of them runs code of the file's choosing."""
    from numpy._core import multiarray

    types = [multiarray._reconstruct, multiarray.scalar]
    out: list = [*types, np.ndarray, np.dtype, *{type(np.dtype(c)) for c in "?bhilqBHILQefdgFD"}]
    out += [(t, f"numpy.core.multiarray.{t.__name__}") for t in types]
    return out


def _torch_load(path: Path) -> Any:
    with warnings.catch_warnings():  # torch's notes on odd pickle protocols: the errors below say it all
        warnings.simplefilter("ignore")
        return torch.load(path, map_location="cpu", weights_only=True)


def load(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint without running code in it; DataError naming the file if it is not one."""
    path = Path(path)
    try:
        try:
            raw = _torch_load(path)
        except pickle.UnpicklingError as e:
            if "Weights only load failed" not in str(e) or "numpy" not in str(e):
                raise
            with torch.serialization.safe_globals(_legacy_globals()):
                raw = _torch_load(path)
    except FileNotFoundError:
        raise DataError(f"{path}: checkpoint not found") from None
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        why = next((ln for ln in lines if "unsupported GLOBAL" in ln or "Unsupported global" in ln), "")
        if why:  # a reference to code: name what a crafted file would call, never torch's advice to allow it
            ref = re.search(r"GLOBAL\s+([\w.]+)", why)
            what = f"it references {ref.group(1)}" if ref else "it references code"
            raise DataError(f"{path}: refusing to load: not a checkpoint of plain data, loading it could run "
                            f"code ({what})") from None
        detail = next((ln for ln in lines if "nsupported" in ln), "unpickling failed")
        raise DataError(f"{path}: not a readable checkpoint (corrupt: {detail})") from None
    except _CORRUPT as e:  # truncated or not a torch file
        first = str(e).strip().splitlines()
        raise DataError(f"{path}: not a readable checkpoint (truncated or corrupt: {type(e).__name__}"
                        f"{': ' + first[0].split('. ')[0] if first else ''})") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: not a dpfl checkpoint (holds a {type(raw).__name__}, not a dict)")
    fmt = raw.pop("format", 1)
    if fmt not in (1, FORMAT):
        raise DataError(f"{path}: checkpoint format {fmt!r} is not one this dpfl reads (1 or {FORMAT})")
    st = from_plain(raw)
    st["format"] = fmt
    return st
