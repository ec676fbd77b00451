"""IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed.

Layout: 2 zero bytes, a type code, the number of dimensions d, then d big-endian uint32
sizes, then the values in C order (big-endian). See http://yann.lecun.com/exdb/mnist/.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from dpfl.errors import DataError

IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

# The four standard file names (each may also end in .gz).
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (gzip detected from its content) into a native-endian array."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read IDX file {path}: {e.strerror or e}") from e
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"IDX file {path} is not valid gzip: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(
            f"{path} is not an IDX file: magic must start with two zero bytes, got {raw[:4].hex()}"
        )
    code, ndim = raw[2], raw[3]
    if code not in IDX_TYPES:
        allowed = ", ".join(f"0x{c:02X}" for c in IDX_TYPES)
        raise DataError(f"{path}: unknown IDX type code 0x{code:02X} (allowed: {allowed})")
    if ndim < 1:
        raise DataError(f"{path}: IDX header declares {ndim} dimensions (need at least 1)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(
            f"{path}: truncated IDX header ({len(raw)} bytes, need {header} for {ndim} dimensions)"
        )
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        have = len(raw) - header
        raise DataError(
            f"{path}: IDX shape {shape} of {dtype.name} needs {expected} data bytes, file has {have}"
        )
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def find_idx_files(directory: Path) -> dict[str, Path] | None:
    """The four standard files in `directory` (raw preferred over .gz), or None if any is missing."""
    found = {}
    for key, name in MNIST_FILES.items():
        for cand in (directory / name, directory / (name + ".gz")):
            if cand.is_file():
                found[key] = cand
                break
        else:
            return None
    return found


def load_idx_split(files: dict[str, Path], num_classes: int = 10) -> tuple[np.ndarray, ...]:
    """Read and cross-check train/test images and labels: uint8 images [N,28,28], labels [N]."""
    arrays = {key: read_idx(path) for key, path in files.items()}
    for split in ("train", "test"):
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        xf, yf = files[f"{split}_images"], files[f"{split}_labels"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or x.dtype != np.uint8:
            raise DataError(
                f"{xf}: expected uint8 images of shape [N, 28, 28], got {x.dtype} {list(x.shape)}"
            )
        if y.ndim != 1 or y.dtype != np.uint8:
            raise DataError(f"{yf}: expected uint8 labels of shape [N], got {y.dtype} {list(y.shape)}")
        if len(x) != len(y):
            raise DataError(f"{xf} has {len(x)} images but {yf} has {len(y)} labels")
        if len(y) and int(y.max()) >= num_classes:
            raise DataError(f"{yf}: label {int(y.max())} outside 0..{num_classes - 1}")
    return (arrays["train_images"], arrays["train_labels"], arrays["test_images"], arrays["test_labels"])
