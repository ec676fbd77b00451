"""Teacher votes and the noisy-max aggregators (LNMax, GNMax, Confident-GNMax)."""

from __future__ import annotations

import numpy as np

from dpfl.errors import DataError, PrivacyError
from dpfl.pate.noise import gaussian, laplace
from dpfl.rng import CryptoRNG

MECHANISMS = ("lnmax", "gnmax", "confident-gnmax")
UNANSWERED = -1  # Confident-GNMax label of a query whose threshold check failed


def vote_counts(teacher_preds: np.ndarray, num_classes: int | None = None) -> np.ndarray:
    """Vote histogram [examples, classes] from a teacher-predictions matrix [teachers, examples]."""
    preds = np.asarray(teacher_preds)
    if preds.ndim != 2:
        raise DataError(f"teacher predictions must be a [teachers, examples] matrix, got shape {preds.shape}")
    if not np.issubdtype(preds.dtype, np.integer):
        if not np.all(np.equal(np.mod(preds, 1), 0)):
            raise DataError("teacher predictions must be integer class ids")
        preds = preds.astype(np.int64)
    if preds.size and preds.min() < 0:
        raise DataError(f"teacher predictions must be class ids >= 0, got {preds.min()}")
    m = int(preds.max()) + 1 if num_classes is None else int(num_classes)
    if preds.size and preds.max() >= m:
        raise DataError(f"prediction {preds.max()} is outside the {m} classes [0, {m - 1}]")
    counts = np.zeros((preds.shape[1], m), dtype=np.int64)
    for row in preds:  # one teacher at a time: [examples]
        counts[np.arange(preds.shape[1]), row] += 1
    return counts


def noise_per_query(noise: float | np.ndarray, n: int, what: str) -> np.ndarray:
    """Broadcast a scalar or per-query noise parameter to [n], checking it is positive."""
    arr = np.asarray(noise, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and len(arr) != n):
        raise PrivacyError(f"{what} must be a scalar or one value per query ({n}), got shape {arr.shape}")
    if np.any(arr <= 0) or not np.all(np.isfinite(arr)):
        raise PrivacyError(f"{what} must be > 0 and finite, got {arr}")
    return np.broadcast_to(arr, (n,)).copy()


def noisy_max(counts: np.ndarray, mechanism: str, noise: float | np.ndarray, rng: CryptoRNG) -> np.ndarray:
    """Release argmax(counts + noise) per row.

    lnmax: noise = γ, counts get Lap(1/γ) (PATE 2017); gnmax: noise = σ, counts get N(0, σ²)
    (PATE 2018). `noise` may differ per query.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2:
        raise DataError(f"counts must be [queries, classes], got shape {counts.shape}")
    if mechanism == "lnmax":
        gamma = noise_per_query(noise, len(counts), "LNMax γ")
        noisy = counts + laplace(rng, counts.shape, (1.0 / gamma)[:, None])
    elif mechanism == "gnmax":
        sigma = noise_per_query(noise, len(counts), "GNMax σ")
        noisy = counts + gaussian(rng, counts.shape, sigma[:, None])
    elif mechanism == "confident-gnmax":
        raise PrivacyError("confident-gnmax needs a threshold and σ1: use confident_gnmax()")
    else:
        raise PrivacyError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    return noisy.argmax(axis=1)


def check_threshold(threshold: float, sigma1: float) -> None:
    """Confident-GNMax's step-1 parameters: T a number (−inf = always answer), σ1 > 0 and finite."""
    if not isinstance(threshold, (int, float)) or np.isnan(threshold) or threshold == np.inf:
        raise PrivacyError(f"Confident-GNMax threshold T must be a number or -inf, got {threshold!r}")
    if not isinstance(sigma1, (int, float)) or not 0 < sigma1 < np.inf:
        raise PrivacyError(f"Confident-GNMax σ1 must be > 0 and finite, got {sigma1!r}")


def confident_gnmax(
    counts: np.ndarray, threshold: float, sigma1: float, sigma2: float | np.ndarray, rng: CryptoRNG
) -> np.ndarray:
    """Algorithm 1 of Papernot et al. 2018: per row, if max(counts) + N(0, σ1²) ≥ T release
    argmax(counts + N(0, σ2²)), else `UNANSWERED` (−1)."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2:
        raise DataError(f"counts must be [queries, classes], got shape {counts.shape}")
    check_threshold(threshold, sigma1)
    sigma2 = noise_per_query(sigma2, len(counts), "GNMax σ2")
    answered = counts.max(axis=1) + gaussian(rng, len(counts), sigma1) >= threshold
    labels = (counts + gaussian(rng, counts.shape, sigma2[:, None])).argmax(axis=1)
    return np.where(answered, labels, UNANSWERED)
