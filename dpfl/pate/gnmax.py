"""Rényi-DP analysis of GNMax and Confident-GNMax, Papernot et al. 2018 ("Scalable PATE").

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


def log_q_from_gaps(gaps: np.ndarray, sigma: float | np.ndarray) -> np.ndarray:
    """ln q̃ from the gaps n_{i*} − n_i ([..., m], the winner's own entry +inf); sigma broadcasts to [...]."""
    gaps = np.asarray(gaps, dtype=np.float64)
    scale = math.sqrt(2.0) * np.asarray(sigma, dtype=np.float64)[..., None]
    logs = stats.norm.logsf(gaps, scale=scale)
    return np.minimum(special.logsumexp(logs, axis=-1), math.log(1.0 - 1.0 / gaps.shape[-1]))


def log_q_bound(counts: np.ndarray, sigma: float | np.ndarray) -> np.ndarray:
    """Prop. 7: ln q̃ with q̃ = min(1 − 1/m, Σ_{i≠i*} Pr[N(0, 2σ²) ≥ n_{i*} − n_i]), per row."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    sigma = np.broadcast_to(np.atleast_1d(np.asarray(sigma, dtype=np.float64)), (len(counts),))
    winner = counts.argmax(axis=1)
    gaps = counts[np.arange(len(counts)), winner][:, None] - counts
    gaps[np.arange(len(counts)), winner] = np.inf
    return log_q_from_gaps(gaps, sigma)


def rdp_data_independent(sigma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Prop. 8: RDP α/σ² per query, [Q, orders]."""
    sigma, orders = _check(sigma, orders)
    return orders[None, :] / sigma[:, None] ** 2


def rdp_data_dependent(log_q: np.ndarray, sigma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Theorem 6 where it applies, else the data-independent bound; [Q, orders]."""
    log_q = np.atleast_1d(np.asarray(log_q, dtype=np.float64))
    sigma, orders = _check(np.broadcast_to(np.atleast_1d(sigma), log_q.shape), orders)
    if np.any(log_q > 0) or np.any(np.isnan(log_q)):
        raise PrivacyError(f"ln q must be <= 0, got max {log_q.max()}")
    out = rdp_data_independent(sigma, orders)
    lq, var, lam = log_q[:, None], (sigma * sigma)[:, None], orders[None, :]
    with np.errstate(all="ignore"):  # invalid entries are masked out below
        mu2 = np.sqrt(var * -lq)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / var, mu2 / var
        # Theorem 6 preconditions: q̃ e^{ε2} < 1 and q̃ ≤ e^{(μ2−1)ε2} / (μ1/(μ1−1) · μ2/(μ2−1))^{μ2}.
        ok = (
            np.isfinite(lq)
            & (mu2 > 1.0)
            & (lam < mu1)
            & (-lq > eps2)
            & (lq <= (mu2 - 1) * eps2 - mu2 * np.log(mu1 / (mu1 - 1) * mu2 / (mu2 - 1)))
        )
        log1q = np.log1p(-np.exp(lq))
        log_a = (lam - 1) * (log1q - np.log1p(-np.exp((lq + eps2) * (1 - 1 / mu2))))
        log_b = (lam - 1) * (eps1 - lq / (mu1 - 1))
        bound = np.logaddexp(log1q + log_a, lq + log_b) / (lam - 1)
    out = np.where(ok, np.minimum(out, bound), out)
    return np.where(np.isneginf(lq), 0.0, out)  # q̃ = 0: the output is fixed


# ---------------------------------------------------------------- Confident-GNMax's threshold check
#
# Step 1 releases [max_i n_i + N(0, σ1²) ≥ T]. Moving one vote changes max_i n_i by at most 1, so the
# check is a Gaussian mechanism of sensitivity 1: RDP α/(2σ1²), i.e. GNMax's bound at σ = √2·σ1.
# Data dependent: its likelier outcome fails with probability q = min(p, 1 − p), p = Pr[answered],
# and Theorem 6 applies to that q at σ = √2·σ1 (Papernot et al. 2018, Sec. 4 and App. B).


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """ln(1 − e^x) for x <= 0, accurate at both ends."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(x < -math.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def log_pr_answered(max_votes: np.ndarray, threshold: float, sigma1: float) -> np.ndarray:
    """ln Pr[max vote + N(0, σ1²) ≥ T] per query."""
    return stats.norm.logsf(threshold - np.asarray(max_votes, dtype=np.float64), scale=sigma1)


def rdp_threshold_data_independent(sigma1: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """α/(2σ1²) per check, [Q, orders]."""
    return rdp_data_independent(math.sqrt(2.0) * np.asarray(sigma1, dtype=np.float64), orders)


def rdp_threshold(log_p: np.ndarray, sigma1: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of the check from ln p = ln Pr[answered] ([Q] -> [Q, orders])."""
    log_p = np.atleast_1d(np.asarray(log_p, dtype=np.float64))
    log_q = np.minimum(log_p, _log1mexp(log_p))
    return rdp_data_dependent(log_q, math.sqrt(2.0) * np.asarray(sigma1, dtype=np.float64), orders)


def epsilon_from_rdp(rdp: np.ndarray, orders: np.ndarray, delta: float) -> tuple[float, float]:
    """(ε, best order) with ε = min_α RDP(α) + ln(1/δ)/(α − 1) (Mironov 2017, Prop. 3)."""
    if not 0 < delta < 1:
        raise PrivacyError(f"δ must lie in (0, 1), got {delta}")
    orders = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp) + math.log(1.0 / delta) / (orders - 1)
    i = int(np.argmin(eps))
    return float(eps[i]), float(orders[i])
