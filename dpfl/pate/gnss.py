"""Smooth-sensitivity release of the data-dependent ε of GNMax and Confident-GNMax.

The data-dependent RDP at a fixed order λ, f(D) = Σ_queries [RDP_check(λ) + answered · RDP_GNMax(λ)],
depends on the raw votes. It is released by the GNSS mechanism f(D) + S(D)·N(0, σ_s²), S a β-smooth
upper bound on the local sensitivity of f, which is (λ, λe^{2β}/σ_s² + (βλ − ½ln(1 − 2λβ))/(λ − 1))-RDP
for 1 < λ < 1/(2β) (Papernot et al. 2018, Theorem 23).

S comes from per-query bounds U_r on the local sensitivity anywhere within distance r (r teachers
changed): S = max_r e^{−βr} Σ_queries U_r. Then S(n) ≤ e^β S(n') for neighbours because the ball of
radius r around n lies in the ball of radius r + 1 around n' (Nissim et al. 2007, Def. 2.1).

* GNMax step: as for LNMax (see lnmax.py), within distance r every gap to the winner moves by at
  most 2r, so q̃ (Prop. 7) stays in [q_lo(r), q_hi(r)] (gaps + 2r capped at the number of votes,
  gaps − 2r floored at 0); the RDP bound is non-decreasing in q̃ (the paper's condition C5, checked
  numerically on the values used), so U_r = RDP(q_hi(r+1)) − RDP(q_lo(r+1)).
* threshold check: its RDP depends on the max vote v only, which moves by at most one per changed
  teacher, so U_r = max of the exact local sensitivity over max votes in [v − r, v + r].
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.pate import gnmax


class NotMonotoneError(PrivacyError):
    """The RDP bound is not non-decreasing in q̃ where the bracketing needs it."""


def gnss_rdp(beta: float, ss_sigma: float, order: float) -> float:
    """Theorem 23: RDP at `order` of releasing f + S·N(0, ss_sigma²), S β-smooth."""
    if not beta > 0 or not 0 < ss_sigma < math.inf:
        raise PrivacyError(f"need β > 0 and σ_s > 0, got β={beta}, σ_s={ss_sigma}")
    if not 1 < order < 1 / (2 * beta):
        raise PrivacyError(
            f"the release order must lie in (1, 1/(2β)) = (1, {1 / (2 * beta):.4g}), got {order}"
        )
    return order * math.exp(2 * beta) / ss_sigma**2 + (
        beta * order - 0.5 * math.log(1 - 2 * order * beta)
    ) / (order - 1)


def gnmax_rdp_at(log_q: np.ndarray, sigma: np.ndarray, order: float) -> np.ndarray:
    """RDP of GNMax at one order for an array of ln q̃ (any shape) with matching σ."""
    log_q = np.asarray(log_q, dtype=np.float64)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), log_q.shape)
    return gnmax.rdp_data_dependent(log_q.ravel(), sigma.ravel(), [order])[:, 0].reshape(log_q.shape)


def gnmax_ls_bounds(counts: np.ndarray, sigma: np.ndarray, order: float) -> np.ndarray:
    """U_r for r = 0..T (T votes per query): bounds on GNMax's local sensitivity at distance r, [T+1, Q]."""
    counts = np.asarray(counts, dtype=np.float64)
    n_q = len(counts)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (n_q,))
    total = float(counts[0].sum())
    winner = counts.argmax(axis=1)
    gaps = counts[np.arange(n_q), winner][:, None] - counts  # [Q, m]
    r = np.arange(1, int(total) + 2, dtype=np.float64)[:, None, None]  # r + 1 for r = 0..T
    hi = np.maximum(0.0, gaps[None] - 2 * r)
    lo = np.minimum(gaps[None] + 2 * r, total)
    hi[:, np.arange(n_q), winner] = np.inf  # the winner's own term is left out of q̃
    lo[:, np.arange(n_q), winner] = np.inf
    lq_hi, lq_lo = gnmax.log_q_from_gaps(hi, sigma[None]), gnmax.log_q_from_gaps(lo, sigma[None])
    f_hi, f_lo = gnmax_rdp_at(lq_hi, sigma[None], order), gnmax_rdp_at(lq_lo, sigma[None], order)
    _check_monotone(np.concatenate([lq_hi.ravel(), lq_lo.ravel()]), sigma, order)
    return f_hi - f_lo


def _check_monotone(log_q: np.ndarray, sigma: np.ndarray, order: float) -> None:
    """The bracketing needs RDP(q̃) non-decreasing in q̃: check it on the values used and a fine grid."""
    for s in np.unique(sigma):
        grid = np.concatenate([log_q[np.isfinite(log_q)], np.linspace(log_q.min(initial=0.0), 0.0, 4001)])
        grid = np.unique(np.minimum(grid, 0.0))
        f = gnmax_rdp_at(grid, np.full(grid.shape, s), order)
        if np.any(np.diff(f) < -1e-12):
            raise NotMonotoneError(
                f"GNMax's RDP bound at order {order} is not monotone in q for σ={s}: "
                "its smooth-sensitivity bound does not apply; choose another order"
            )


def threshold_ls_bounds(
    max_votes: np.ndarray, teachers: int, threshold: float, sigma1: float, order: float
) -> np.ndarray:
    """U_r for r = 0..T: bounds on the threshold check's local sensitivity at distance r, [T+1, Q]."""
    v = np.arange(teachers + 1, dtype=np.float64)
    f = gnmax.rdp_threshold(gnmax.log_pr_answered(v, threshold, sigma1), sigma1, [order])[:, 0]
    step = np.abs(np.diff(f))
    ls = np.maximum(np.r_[0.0, step], np.r_[step, 0.0])  # exact local sensitivity at max vote v
    v0 = np.asarray(max_votes, dtype=np.int64)
    out = np.empty((teachers + 1, len(v0)))
    cur = ls[v0]
    for r in range(teachers + 1):
        cur = np.maximum(cur, np.maximum(ls[np.maximum(v0 - r, 0)], ls[np.minimum(v0 + r, teachers)]))
        out[r] = cur
    return out


def smooth_bound(total: np.ndarray, beta: float) -> float:
    """max_r e^{−βr} U_r for U_r = Σ_queries of the bounds at distance r = 0, 1, ..."""
    if not beta > 0:
        raise PrivacyError(f"smooth-sensitivity β must be > 0, got {beta}")
    total = np.asarray(total, dtype=np.float64)
    return float((np.exp(-beta * np.arange(len(total))) * total).max())
