"""IMDB reviews from a local Keras `imdb.npz`, processed exactly as the thesis's Keras code.

Keras 2.2 `imdb.load_data(num_words=5000)` then `pad_sequences(maxlen=400)`:
shuffle train and test with numpy seed 113, prepend start token 1, shift word ranks by 3,
replace ranks >= 5000 by the out-of-vocabulary token 2, then left-pad with 0 / keep the
last 400 tokens ('pre' padding and truncation). Output: int64 tokens [N, 400], labels 0/1.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dpfl.data.dataset import DATA_DIR_ENV, Dataset, data_dirs, labels_to_tensor, subset
from dpfl.data.safe_pickle import load_npz
from dpfl.errors import ConfigError, DataError

START, OOV, INDEX_FROM, KERAS_SEED = 1, 2, 3, 113


def keras_imdb_tokens(reviews, num_words: int = 5000, maxlen: int = 400) -> np.ndarray:
    """Word-rank lists -> int64 [N, maxlen] as Keras (start 1, +3 shift, oov 2, 'pre' pad/truncate)."""
    out = np.zeros((len(reviews), maxlen), dtype=np.int64)
    for i, r in enumerate(reviews):
        seq = np.concatenate([[START], np.asarray(r, dtype=np.int64) + INDEX_FROM])
        seq[seq >= num_words] = OOV
        seq = seq[-maxlen:]
        out[i, maxlen - len(seq) :] = seq
    return out


def load_imdb(
    root: str | os.PathLike | None = None,
    seed: int = 0,
    num_words: int = 5000,
    maxlen: int = 400,
    n_train: int | None = None,
    n_test: int | None = None,
) -> Dataset:
    if num_words < 4 or maxlen < 1:
        raise ConfigError(f"imdb needs num_words >= 4 and maxlen >= 1, got {num_words}, {maxlen}")
    tried = []
    keras_dir = [] if root is not None else [Path.home() / ".keras" / "datasets"]
    for d in data_dirs("imdb", root) + keras_dir:
        path = d if d.suffix == ".npz" else d / "imdb.npz"
        if path.is_file():
            break
        tried.append(str(path))
    else:
        raise DataError(
            "imdb: no local Keras imdb.npz found (nothing is downloaded). Paths tried:\n  "
            + "\n  ".join(tried)
            + f"\nFix: pass root= (imdb.npz or its directory) or set {DATA_DIR_ENV}; "
            "for code-path tests use 'imdb-synthetic'"
        )
    a = load_npz(path)
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in a]
    if missing:
        raise DataError(f"{path}: missing arrays {missing} (has {sorted(a)})")
    rs = np.random.RandomState(KERAS_SEED)  # Keras: np.random.seed(113), then two shuffles
    parts = []
    for split in ("train", "test"):
        x, y = a[f"x_{split}"], np.asarray(a[f"y_{split}"])
        if len(x) != len(y) or not set(np.unique(y).tolist()) <= {0, 1}:
            raise DataError(f"{path}: x_{split}/y_{split} must have equal length and 0/1 labels")
        idx = np.arange(len(x))
        rs.shuffle(idx)
        parts += [torch.from_numpy(keras_imdb_tokens(x[idx], num_words, maxlen)), labels_to_tensor(y[idx])]
    ds = Dataset(
        "imdb",
        *parts,
        num_classes=2,
        task="binary",
        source=f"Keras imdb.npz {path} (vocab {num_words}, maxlen {maxlen})",
    )
    return subset(ds, seed, n_train, n_test)
