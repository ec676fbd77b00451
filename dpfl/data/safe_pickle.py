"""Loading pickled data files without running arbitrary code.

CIFAR-10's python batches and Keras's imdb.npz (object arrays of lists) are pickles. A
plain `pickle.load` would execute whatever a tampered file asks for, so only the globals
needed to rebuild numpy arrays are allowed.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

from dpfl.errors import DataError

ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a data file")
        return super().find_class(module, name)


def load_pickle(path: Path, fp=None):
    """Unpickle (latin1 strings, as for Python 2 pickles) allowing only numpy array globals."""
    try:
        if fp is None:
            with open(path, "rb") as f:
                return _Restricted(f, encoding="latin1").load()
        return _Restricted(fp, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise DataError(f"{path}: not a plain pickled array file ({e})") from e


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz; object arrays go through the restricted unpickler."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                key = member.removesuffix(".npy")
                with z.open(member) as f:
                    fp = io.BytesIO(f.read())
                version = np.lib.format.read_magic(fp)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
                if dtype.hasobject:
                    arr = load_pickle(path, fp)
                else:
                    arr = np.frombuffer(fp.read(), dtype=dtype, count=int(np.prod(shape)))
                    arr = arr.reshape(shape, order="F" if fortran else "C").copy()
                out[key] = np.asarray(arr)
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise DataError(f"{path}: not a valid .npz file ({e})") from e
    return out
