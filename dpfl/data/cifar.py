"""CIFAR-10 from local files: the python batches directory or an .npz.

Nothing is downloaded. Accepted layouts:
- `cifar-10-batches-py/` with data_batch_1..5 and test_batch (the official python version,
  also what Keras caches in ~/.keras/datasets/);
- an .npz with x_train, y_train, x_test, y_test (uint8 images [N,32,32,3] or [N,3,32,32]).
Images become float32 [N, 3, 32, 32] in [0, 1]. The thesis's augmentation to 500,000
training images (random shifts and flips) is not applied here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpfl.data.dataset import DATA_DIR_ENV, Dataset, data_dirs, images_to_tensor, labels_to_tensor, subset
from dpfl.data.safe_pickle import load_npz, load_pickle
from dpfl.errors import DataError

BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
NPZ_NAME = "cifar10.npz"


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    d = load_pickle(path)
    if isinstance(d, dict):
        d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}
    if not isinstance(d, dict) or "data" not in d or "labels" not in d:
        raise DataError(f"{path}: expected a CIFAR-10 batch dict with 'data' and 'labels'")
    x, y = np.asarray(d["data"]), np.asarray(d["labels"])
    if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
        raise DataError(
            f"{path}: expected uint8 data [N, 3072] and N labels, got {x.dtype} {list(x.shape)}, "
            f"{len(y)} labels"
        )
    return x.reshape(-1, 3, 32, 32), y


def _chw(x: np.ndarray, path: Path, key: str) -> np.ndarray:
    if x.dtype == np.uint8 and x.ndim == 4 and x.shape[1:] == (32, 32, 3):
        return x.transpose(0, 3, 1, 2)
    if x.dtype == np.uint8 and x.ndim == 4 and x.shape[1:] == (3, 32, 32):
        return x
    raise DataError(f"{path}: {key} must be uint8 [N,32,32,3] or [N,3,32,32], got {x.dtype} {list(x.shape)}")


def _read_npz(path: Path) -> tuple[np.ndarray, ...]:
    a = load_npz(path)
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in a]
    if missing:
        raise DataError(f"{path}: missing arrays {missing} (has {sorted(a)})")
    return _chw(a["x_train"], path, "x_train"), a["y_train"], _chw(a["x_test"], path, "x_test"), a["y_test"]


def load_cifar10(
    root: str | os.PathLike | None = None,
    seed: int = 0,
    n_train: int | None = None,
    n_test: int | None = None,
) -> Dataset:
    tried: list[str] = []
    for d in data_dirs("cifar-10-batches-py", root, "cifar10"):
        if d.is_file() and d.suffix == ".npz":
            xtr, ytr, xte, yte = _read_npz(d)
            source = f"CIFAR-10 npz {d}"
            break
        if all((d / b).is_file() for b in BATCHES + [TEST_BATCH]):
            parts = [_read_batch(d / b) for b in BATCHES]
            xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            xte, yte = _read_batch(d / TEST_BATCH)
            source = f"CIFAR-10 python batches in {d}"
            break
        if (d / NPZ_NAME).is_file():
            xtr, ytr, xte, yte = _read_npz(d / NPZ_NAME)
            source = f"CIFAR-10 npz {d / NPZ_NAME}"
            break
        tried.append(f"{d}/{{data_batch_1..5,test_batch}} or {d / NPZ_NAME}")
    else:
        raise DataError(
            "cifar10: no local CIFAR-10 files found (nothing is downloaded). Paths tried:\n  "
            + "\n  ".join(tried)
            + f"\nFix: pass root= (a cifar-10-batches-py directory or an .npz) or set {DATA_DIR_ENV}; "
            "for code-path tests use 'cifar10-synthetic'"
        )
    ytr, yte = labels_to_tensor(ytr), labels_to_tensor(yte)
    for y, what in ((ytr, "train"), (yte, "test")):
        if len(y) and (int(y.min()) < 0 or int(y.max()) > 9):
            raise DataError(f"{source}: {what} labels outside 0..9")
    ds = Dataset(
        "cifar10",
        images_to_tensor(xtr),
        ytr,
        images_to_tensor(xte),
        yte,
        num_classes=10,
        task="multiclass",
        source=source,
    )
    return subset(ds, seed, n_train, n_test)
