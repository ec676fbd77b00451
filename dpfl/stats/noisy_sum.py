"""Noisy sums across clients, with the noise split into shares so a secure sum carries it.

Each client adds its own share before the (secure) sum, so the server only ever sees the
total plus noise of exactly the wanted distribution:

- Laplace(b) is infinitely divisible: Lap(b) = sum_i (G_i - G'_i) with G_i, G'_i ~ Gamma(1/k, b)
  independent, so each of k clients adds one Gamma difference;
- N(0, s^2) = sum_i N(0, s^2 / k).

The guarantee assumes every share is added (a client that drops out takes its share with it)
and that clients do not pool their shares. The summation itself is pluggable: `plain_sum`
stands in until `dpfl.secagg` provides the masked sum over Z_(2^b).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

from dpfl.errors import ConfigError, DataError
from dpfl.privacy.mechanisms import gaussian_noise, laplace_noise
from dpfl.privacy.samplers import source
from dpfl.rng import CryptoRNG

Summer = Callable[[np.ndarray], np.ndarray]  # client rows [k, m] -> their sum [m]


def plain_sum(rows: np.ndarray) -> np.ndarray:
    """Stand-in for a secure sum: the server sees only this total in the real protocol."""
    return np.asarray(rows, dtype=np.float64).sum(axis=0)


def laplace_share(n_clients: int, scale: np.ndarray | float, size: int, rng: CryptoRNG) -> np.ndarray:
    """One client's share of Lap(scale): G - G' with G, G' ~ Gamma(1/n_clients, scale).

    One client: plain Laplace noise (`dpfl.privacy.mechanisms`). Several: Gamma variates by
    inverting the regularised incomplete gamma function at 53-bit uniforms.
    """
    if n_clients < 1:
        raise ConfigError(f"n_clients must be >= 1, got {n_clients}")
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), (size,))
    if n_clients == 1:
        return laplace_noise((size,), 1.0, rng) * scale
    g = special.gammaincinv(1.0 / n_clients, source(rng, False).uniform_open(2 * size)).reshape(2, size)
    return (g[0] - g[1]) * scale


def gaussian_share(n_clients: int, sigma: np.ndarray | float, size: int, rng: CryptoRNG) -> np.ndarray:
    """One client's share of N(0, sigma^2): N(0, sigma^2 / n_clients)."""
    if n_clients < 1:
        raise ConfigError(f"n_clients must be >= 1, got {n_clients}")
    return gaussian_noise((size,), 1.0, rng) * np.asarray(sigma, dtype=np.float64) / np.sqrt(n_clients)


def noisy_sum(
    rows: Sequence[np.ndarray] | np.ndarray,
    rngs: Sequence[CryptoRNG],
    *,
    laplace_scale: np.ndarray | float | None = None,
    gaussian_sigma: np.ndarray | float | None = None,
    summer: Summer = plain_sum,
) -> np.ndarray:
    """Sum of the clients' rows plus Lap(laplace_scale) or N(0, gaussian_sigma^2) per coordinate.

    `rngs[i]` is client i's own noise source. Scales may be per coordinate.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise DataError(f"rows must be [n_clients, m] with n_clients >= 1, got shape {rows.shape}")
    k, m = rows.shape
    if len(rngs) != k:
        raise ConfigError(f"need one noise source per client: {k} clients, {len(rngs)} sources")
    if (laplace_scale is None) == (gaussian_sigma is None):
        raise ConfigError("give exactly one of laplace_scale or gaussian_sigma")
    if laplace_scale is not None:
        shares = [laplace_share(k, laplace_scale, m, r) for r in rngs]
    else:
        shares = [gaussian_share(k, gaussian_sigma, m, r) for r in rngs]
    return np.asarray(summer(rows + np.stack(shares)), dtype=np.float64)
