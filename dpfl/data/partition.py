"""Splitting a training set over clients, and per-client majority-class down-sampling.

Every partitioner returns disjoint int64 index arrays, one per client, each in a random
(seed-determined) order; the same seed gives the same split.

- "shards": the thesis's split, equal random shards |D_k| = N / n_clients (`size` to take
  only n_clients·size samples; the remainder is unused).
- "dirichlet": label skew; each class is divided over clients in proportions drawn from
  Dirichlet(alpha·1) (Hsu et al. 2019). Redrawn until every client has >= `min_size` samples.
- "classes": every client holds exactly `classes_per_client` distinct classes; a class is
  divided equally over the clients holding it (classes are dealt round-robin from a random
  class order, so the numbers of holders of two classes differ by at most one).
- "quantity": IID labels, sizes proportional to LogNormal(0, sigma) weights (at least
  `min_size` each; largest-remainder rounding).
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds


def _labels(labels) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.cpu().numpy()
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels must be a 1-D integer array, got {y.dtype} with shape {list(y.shape)}")
    return y


def partition(labels, n_clients: int, method: str = "shards", seed: int = 0, **kw) -> list[np.ndarray]:
    """Split range(len(labels)) over `n_clients` clients (see the module docstring for methods)."""
    y = _labels(labels)
    if method not in METHODS:
        raise ConfigError(f"unknown partition method {method!r}; allowed: {', '.join(METHODS)}")
    unknown = set(kw) - set(METHODS[method][1])
    if unknown:
        raise ConfigError(
            f"partition method {method!r} got unknown options {sorted(unknown)}; "
            f"allowed: {', '.join(METHODS[method][1])}"
        )
    if not isinstance(n_clients, (int, np.integer)) or not 1 <= n_clients <= len(y):
        raise ConfigError(
            f"n_clients must be an integer in 1..{len(y)} (the number of samples), got {n_clients!r}"
        )
    fn, defaults = METHODS[method]
    rng = Seeds(seed).numpy("partition", method)
    return fn(y, int(n_clients), rng, **{**defaults, **kw})


def _shards(y, n, rng, size):
    size = len(y) // n if size is None else size
    if not isinstance(size, (int, np.integer)) or size < 1 or n * size > len(y):
        raise ConfigError(
            f"shards size must be an integer in 1..{len(y) // n} for {n} clients "
            f"and {len(y)} samples, got {size!r}"
        )
    perm = rng.permutation(len(y))[: n * size]
    return [perm[i * size : (i + 1) * size] for i in range(n)]


def _dirichlet(y, n, rng, alpha, min_size, max_tries):
    if not alpha > 0:
        raise ConfigError(f"dirichlet alpha must be > 0, got {alpha!r}")
    if not 0 <= min_size <= len(y) // n:
        raise ConfigError(f"dirichlet min_size must be in 0..{len(y) // n}, got {min_size!r}")
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(n, float(alpha)))) * len(idx)).astype(np.int64)[:-1]
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        clients = [np.concatenate(p) for p in parts]
        if min(len(c) for c in clients) >= min_size:
            return [rng.permutation(c) for c in clients]
    raise ConfigError(
        f"dirichlet split with alpha={alpha} gave a client under min_size={min_size} in "
        f"{max_tries} tries; raise alpha or lower min_size"
    )


def _classes(y, n, rng, classes_per_client):
    classes = np.unique(y)
    k = classes_per_client
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= len(classes):
        raise ConfigError(f"classes_per_client must be an integer in 1..{len(classes)}, got {k!r}")
    order = rng.permutation(classes)
    held = [order[(i * k + np.arange(k)) % len(classes)] for i in range(n)]
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in classes:
        holders = [i for i in range(n) if c in held[i]]
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < len(holders):
            raise ConfigError(
                f"class {c} has {len(idx)} samples for {len(holders)} clients; "
                "use fewer clients or fewer classes_per_client"
            )
        for i, piece in zip(holders, np.array_split(idx, len(holders))):
            parts[i].append(piece)
    return [rng.permutation(np.concatenate(p)) for p in parts]


def _quantity(y, n, rng, sigma, min_size):
    if not sigma >= 0:
        raise ConfigError(f"quantity sigma must be >= 0, got {sigma!r}")
    if not isinstance(min_size, (int, np.integer)) or not 1 <= min_size <= len(y) // n:
        raise ConfigError(f"quantity min_size must be an integer in 1..{len(y) // n}, got {min_size!r}")
    w = rng.lognormal(0.0, float(sigma), size=n)
    sizes = min_size + largest_remainder(w, len(y) - n * min_size)
    perm = rng.permutation(len(y))
    return np.split(perm, np.cumsum(sizes)[:-1])


METHODS = {  # name -> (function, default options)
    "shards": (_shards, {"size": None}),
    "dirichlet": (_dirichlet, {"alpha": 0.5, "min_size": 1, "max_tries": 1000}),
    "classes": (_classes, {"classes_per_client": 2}),
    "quantity": (_quantity, {"sigma": 1.0, "min_size": 1}),
}


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to `total`, proportional to `weights` (largest-remainder rounding)."""
    raw = np.asarray(weights, dtype=np.float64) / np.sum(weights) * total
    out = np.floor(raw).astype(np.int64)
    extra = total - int(out.sum())
    out[np.argsort(-(raw - out), kind="stable")[:extra]] += 1
    return out


def downsample_majority(indices, labels, rng: np.random.Generator) -> np.ndarray:
    """Keep every sample of the rarest class and an equal-size random subset of each other class.

    For a binary client with p positives (p < negatives) this keeps 2p samples (the thesis's
    356-patient public hospital with 12 positives becomes 24). Order of `indices` is kept.
    """
    idx = np.asarray(indices, dtype=np.int64)
    y = _labels(labels)[idx]
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise DataError(
            f"cannot down-sample a client whose {len(idx)} samples all have label "
            f"{classes.tolist()}; every client needs both classes"
        )
    m = int(counts.min())
    keep = np.zeros(len(idx), dtype=bool)
    for c, count in zip(classes, counts):
        where = np.flatnonzero(y == c)
        keep[where if count == m else rng.choice(where, size=m, replace=False)] = True
    return idx[keep]
