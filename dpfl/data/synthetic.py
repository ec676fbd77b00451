"""Synthetic CIFAR-10- and IMDB-shaped data, to exercise the All-CNN-C and CNN-LSTM code paths.

Both are learnable (class-dependent signal plus noise) but say nothing about accuracy on the
real datasets. Default sizes are the real ones (CIFAR 50,000/10,000; IMDB 25,000/25,000).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dpfl.data.dataset import Dataset
from dpfl.data.imdb import OOV, START
from dpfl.errors import ConfigError
from dpfl.rng import Seeds


def _sizes(name: str, n_train, n_test, default: tuple[int, int]) -> tuple[int, int]:
    out = []
    for what, n, d in (("n_train", n_train, default[0]), ("n_test", n_test, default[1])):
        n = d if n is None else n
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"{name}: {what} must be a positive integer, got {n!r}")
        out.append(int(n))
    return out[0], out[1]


def load_cifar10_synthetic(
    root=None, seed: int = 0, n_train: int | None = None, n_test: int | None = None, noise: float = 0.25
) -> Dataset:
    """float32 [N, 3, 32, 32] in [0, 1]: one smooth random template per class plus Gaussian noise.
    Default sizes 50,000 / 10,000."""
    n_train, n_test = _sizes("cifar10-synthetic", n_train, n_test, (50_000, 10_000))
    s = Seeds(seed)
    g = s.torch("data", "cifar10-synthetic", "templates")
    templates = F.interpolate(
        torch.rand(10, 3, 4, 4, generator=g), size=(32, 32), mode="bilinear", align_corners=False
    )

    def draw(n: int, split: str):
        gs = s.torch("data", "cifar10-synthetic", split)
        y = torch.randint(0, 10, (n,), generator=gs)
        x = templates[y] + noise * torch.randn(n, 3, 32, 32, generator=gs)
        return x.clamp_(0.0, 1.0), y

    xtr, ytr = draw(n_train, "train")
    xte, yte = draw(n_test, "test")
    return Dataset(
        "cifar10-synthetic",
        xtr,
        ytr,
        xte,
        yte,
        num_classes=10,
        task="multiclass",
        source=f"synthetic CIFAR-10-shaped images (seed {seed}, noise {noise})",
    )


def load_imdb_synthetic(
    root=None,
    seed: int = 0,
    n_train: int | None = None,
    n_test: int | None = None,
    num_words: int = 5000,
    maxlen: int = 400,
) -> Dataset:
    """int64 tokens [N, maxlen] laid out as the Keras IMDB pipeline (0 pad on the left, start 1,
    oov 2, words from 4): Zipf-distributed words, review lengths log-normal (median 180), and
    200 positive / 200 negative sentiment words whose rates depend on the label.
    Default sizes 25,000 / 25,000."""
    n_train, n_test = _sizes("imdb-synthetic", n_train, n_test, (25_000, 25_000))
    if num_words < 1000 or maxlen < 10:
        raise ConfigError(
            f"imdb-synthetic needs num_words >= 1000 and maxlen >= 10, got {num_words}, {maxlen}"
        )
    s = Seeds(seed)
    words = np.arange(4, num_words)
    p = 1.0 / (np.arange(len(words)) + 10.0)
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    sentiment = s.numpy("data", "imdb-synthetic", "lexicon").choice(words[50:], size=400, replace=False)
    pos, neg = sentiment[:200], sentiment[200:]

    def draw(n: int, split: str):
        rng = s.numpy("data", "imdb-synthetic", split)
        y = rng.integers(0, 2, size=n)
        lengths = np.clip(np.round(rng.lognormal(np.log(180.0), 0.6, size=n)), 10, 2000).astype(np.int64)
        lengths = np.minimum(lengths, maxlen - 1)  # generated text is what survives 'pre' truncation
        row = np.repeat(np.arange(n), lengths)
        col = np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + maxlen - lengths[row]
        tok = words[np.searchsorted(cdf, rng.random(len(row)), side="right")]
        sent = np.flatnonzero(rng.random(len(row)) < 0.06)  # sentiment words: 3/4 agree with the label
        positive = (rng.random(len(sent)) < 0.75) == (y[row[sent]] == 1)
        tok[sent] = np.where(
            positive, pos[rng.integers(0, 200, len(sent))], neg[rng.integers(0, 200, len(sent))]
        )
        tok[rng.random(len(row)) < 0.02] = OOV
        x = np.zeros((n, maxlen), dtype=np.int64)
        x[row, col] = tok
        x[np.arange(n), maxlen - lengths - 1] = START
        return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))

    xtr, ytr = draw(n_train, "train")
    xte, yte = draw(n_test, "test")
    return Dataset(
        "imdb-synthetic",
        xtr,
        ytr,
        xte,
        yte,
        num_classes=2,
        task="binary",
        source=f"synthetic IMDB-shaped token sequences (seed {seed}, vocab {num_words}, maxlen {maxlen})",
    )
