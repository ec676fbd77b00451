"""Glue shared by the DP estimators and statistics: input checks, public bounds, random sources.

Neighbouring data sets differ by *replacing* one record (bounded DP, the record count n is
public), as in Zhang et al. (2012); every sensitivity in `dpfl.classic` and `dpfl.stats` uses
this convention. Feature bounds are public knowledge the caller supplies; they are never read
off the data, since that would leak.
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.rng import CryptoRNG, Seeds


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise PrivacyError(f"{name} must be a number > 0, got {epsilon!r}") from None
    if not math.isfinite(eps) or eps <= 0:
        raise PrivacyError(f"{name} must be finite and > 0, got {epsilon!r}")
    return eps


def check_fraction(value: float, name: str, low: float = 0.0, high: float = 1.0) -> float:
    v = float(value)
    if not (low < v < high):
        raise ConfigError(f"{name} must lie strictly between {low} and {high}, got {value!r}")
    return v


def check_X(X, name: str = "X") -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise DataError(f"{name} must be a non-empty 2-D array [n_samples, n_features], got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise DataError(f"{name} contains NaN or infinite values")
    return X


def check_Xy(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = check_X(X)
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise DataError(f"y must be 1-D with {X.shape[0]} entries (one per row of X), got shape {y.shape}")
    return X, y


def as_bounds(bounds, d: int, name: str = "bounds") -> tuple[np.ndarray, np.ndarray]:
    """Public per-feature ranges: a pair (lo, hi) of scalars or of length-d arrays, lo < hi."""
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a pair (lo, hi) of scalars or length-{d} arrays, got {bounds!r}") from None
    try:
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), (d,)).copy()
        hi = np.broadcast_to(np.asarray(hi, dtype=np.float64), (d,)).copy()
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be scalars or length-{d} arrays (one per feature), got {bounds!r}") from None
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo < hi)):
        raise ConfigError(f"{name} must be finite with lo < hi for every feature, got lo={lo}, hi={hi}")
    return lo, hi


def to_unit_box(X: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Clip each feature to its public range and map it affinely onto [-1, 1]."""
    if X.shape[1] != lo.shape[0]:
        raise DataError(f"X has {X.shape[1]} features, the bounds describe {lo.shape[0]}")
    return 2.0 * (np.clip(X, lo, hi) - lo) / (hi - lo) - 1.0


def to_unit_ball(X: np.ndarray, bounds, fit_intercept: bool) -> np.ndarray:
    """Rows z with ||z||_2 <= 1 (a per-record map: it costs no privacy).

    With `bounds`, features are mapped to [-1, 1] and each row is projected onto the unit
    ball; without, rows must already lie in the ball. With an intercept the row becomes
    [z, 1] / sqrt(2), still of norm <= 1.
    """
    if bounds is None:
        norms = np.linalg.norm(X, axis=1)
        if np.any(norms > 1.0 + 1e-9):
            raise DataError(
                f"rows of X must have L2 norm <= 1 when bounds=None (largest is {norms.max():.4g}); "
                "pass bounds=(lo, hi) with public feature ranges to rescale"
            )
        Z = X
    else:
        lo, hi = as_bounds(bounds, X.shape[1])
        Z = to_unit_box(X, lo, hi)
        Z = Z / np.maximum(1.0, np.linalg.norm(Z, axis=1, keepdims=True))
    if fit_intercept:
        Z = np.hstack([Z, np.ones((Z.shape[0], 1))]) / math.sqrt(2.0)
    return Z


def noise_rng(random_state: int | None, *purpose: object) -> CryptoRNG:
    """The CSPRNG for DP noise: OS-keyed when random_state is None, seed-keyed otherwise."""
    return CryptoRNG() if random_state is None else Seeds(int(random_state)).crypto(*purpose)


def plain_rng(random_state: int | None, *purpose: object) -> np.random.Generator:
    """Non-secret randomness (feature subsets, orderings)."""
    return np.random.default_rng() if random_state is None else Seeds(int(random_state)).numpy(*purpose)
