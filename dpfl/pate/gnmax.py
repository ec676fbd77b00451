"""Rényi-DP analysis of GNMax (Gaussian noisy max), Papernot et al. 2018 ("Scalable PATE").

A query adds N(0, σ²) to each count; moving one vote changes the count vector by √2 in l2, so
the data-independent RDP is α/σ² (Prop. 8). Data dependent: q̃ ≥ Pr[output ≠ plurality] by a
union bound (Prop. 7) and Theorem 6 with the orders μ2 = σ√(ln 1/q̃), μ1 = μ2 + 1 (Prop. 10).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from dpfl.errors import PrivacyError


def default_orders() -> np.ndarray:
    """Rényi orders (> 1) used when none are given."""
    return np.concatenate([np.arange(1.25, 10, 0.25), np.arange(10, 100, 1.0), np.geomspace(100, 1000, 30)])


def _check(sigma: np.ndarray, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sigma = np.atleast_1d(np.asarray(sigma, dtype=np.float64))
    orders = np.asarray(orders, dtype=np.float64)
    if np.any(sigma <= 0) or not np.all(np.isfinite(sigma)):
        raise PrivacyError(f"GNMax σ must be > 0 and finite, got {sigma}")
    if np.any(orders <= 1):
        raise PrivacyError(f"Rényi orders must be > 1, got min {orders.min()}")
    return sigma, orders


def log_q_bound(counts: np.ndarray, sigma: float | np.ndarray) -> np.ndarray:
    """Prop. 7: ln q̃ with q̃ = min(1 − 1/m, Σ_{i≠i*} Pr[N(0, 2σ²) ≥ n_{i*} − n_i]), per row."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    sigma = np.broadcast_to(np.atleast_1d(np.asarray(sigma, dtype=np.float64)), (len(counts),))
    winner = counts.argmax(axis=1)
    gaps = counts[np.arange(len(counts)), winner][:, None] - counts
    logs = stats.norm.logsf(gaps, scale=math.sqrt(2.0) * sigma[:, None])
    logs[np.arange(len(counts)), winner] = -np.inf
    m = counts.shape[1]
    return np.minimum(special.logsumexp(logs, axis=1), math.log(1.0 - 1.0 / m))


def rdp_data_independent(sigma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Prop. 8: RDP α/σ² per query, [Q, orders]."""
    sigma, orders = _check(sigma, orders)
    return orders[None, :] / sigma[:, None] ** 2


def rdp_data_dependent(log_q: np.ndarray, sigma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Theorem 6 where it applies, else the data-independent bound; [Q, orders]."""
    log_q = np.atleast_1d(np.asarray(log_q, dtype=np.float64))
    sigma, orders = _check(np.broadcast_to(np.atleast_1d(sigma), log_q.shape), orders)
    out = rdp_data_independent(sigma, orders)
    for i, (lq, s) in enumerate(zip(log_q, sigma, strict=True)):
        if lq > 0:
            raise PrivacyError(f"ln q must be <= 0, got {lq}")
        if np.isneginf(lq):
            out[i] = 0.0  # the output is fixed
            continue
        var = s * s
        mu2 = math.sqrt(var * -lq)
        mu1 = mu2 + 1.0
        if mu2 <= 1.0:
            continue
        eps1, eps2 = mu1 / var, mu2 / var
        # Theorem 6 preconditions: q̃ e^{ε2} < 1 and q̃ ≤ e^{(μ2−1)ε2} / (μ1/(μ1−1) · μ2/(μ2−1))^{μ2}.
        if not (-lq > eps2 and lq <= (mu2 - 1) * eps2 - mu2 * math.log(mu1 / (mu1 - 1) * mu2 / (mu2 - 1))):
            continue
        use = orders < mu1
        lam = orders[use]
        log1q = math.log1p(-math.exp(lq))
        log_a = (lam - 1) * (log1q - math.log1p(-math.exp((lq + eps2) * (1 - 1 / mu2))))
        log_b = (lam - 1) * (eps1 - lq / (mu1 - 1))
        bound = np.logaddexp(log1q + log_a, lq + log_b) / (lam - 1)
        out[i, use] = np.minimum(out[i, use], bound)
    return out


def epsilon_from_rdp(rdp: np.ndarray, orders: np.ndarray, delta: float) -> tuple[float, float]:
    """(ε, best order) with ε = min_α RDP(α) + ln(1/δ)/(α − 1) (Mironov 2017, Prop. 3)."""
    if not 0 < delta < 1:
        raise PrivacyError(f"δ must lie in (0, 1), got {delta}")
    orders = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp) + math.log(1.0 / delta) / (orders - 1)
    i = int(np.argmin(eps))
    return float(eps[i]), float(orders[i])
