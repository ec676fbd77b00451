"""Smooth-sensitivity release of the data-dependent ε of GNMax and Confident-GNMax.

The data-dependent RDP at a fixed order λ, f(D) = Σ_queries [RDP_check(λ) + answered · RDP_GNMax(λ)],
depends on the raw votes. It is released by the GNSS mechanism f(D) + S(D)·N(0, σ_s²), S a β-smooth
upper bound on the local sensitivity of f, which is (λ, λe^{2β}/σ_s² + (βλ − ½ln(1 − 2λβ))/(λ − 1))-RDP
for 1 < λ < 1/(2β) (Papernot et al. 2018, Theorem 23).

S comes from per-query bounds U_r on the local sensitivity anywhere within distance r (r teachers
changed): S = max_r e^{−βr} Σ_queries U_r. Then S(n) ≤ e^β S(n') for neighbours because the ball of
radius r around n lies in the ball of radius r + 1 around n' (Nissim et al. 2007, Def. 2.1).

* GNMax step: the RDP bound depends on the votes only through ℓ = ln q̃ (Prop. 7) and is
  non-decreasing in it (the paper's condition C5, checked numerically on the grid used). Within
  distance r every gap to the winner moves by at most 2r, so ℓ stays in [ℓ_lo(r), ℓ_hi(r)] (gaps
  + 2r capped at the number of votes T, gaps − 2r floored at 0; this holds when the winner changes
  too). One vote move changes ℓ by at most D = ln s(T − 2) − ln s(T), s the Gaussian tail (log-
  concave), so U_r = max over ℓ in [ℓ_lo(r), ℓ_hi(r)] of max(RDP(ℓ + D) − RDP(ℓ), RDP(ℓ) − RDP(ℓ − D)),
  evaluated on grid cells with the cell's end points (sound for a monotone RDP).
  This replaces the paper's Algorithm 3 (which needs its Prop. 13 and condition C6).
* threshold check: its RDP depends on the max vote v only, which moves by at most one per changed
  teacher, so U_r = max of the exact local sensitivity over max votes in [v − r, v + r].
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

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


CELLS = 20_000  # grid cells over ln q̃ for the one-step sensitivity bound


def _range_max(c: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(c[lo..hi]) (inclusive) for index arrays lo <= hi, by a sparse table."""
    table = [c]
    while 2 ** len(table) <= len(c):
        prev, w = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(prev[:-w], prev[w:]))
    j = np.floor(np.log2(hi - lo + 1)).astype(np.int64)
    out = np.empty(lo.shape)
    for k in np.unique(j):
        sel = j == k
        out[sel] = np.maximum(table[k][lo[sel]], table[k][hi[sel] - 2**k + 1])
    return out


def _one_step_cells(sigma: float, order: float, total: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell edges over ℓ = ln q̃ and, per cell, a bound on |RDP(ℓ') − RDP(ℓ)| for ℓ in the cell and
    ℓ' the value after one vote move: |ℓ' − ℓ| <= D = ln s(T − 2) − ln s(T), s(g) = Pr[N(0, 2σ²) ≥ g]
    (each gap moves by at most 2, s is log-concave so s(g − 2)/s(g) grows with g <= T)."""
    scale = math.sqrt(2.0) * sigma
    d = float(stats.norm.logsf(max(total - 2.0, 0.0), scale=scale) - stats.norm.logsf(total, scale=scale))
    lo = math.log(m - 1) + float(stats.norm.logsf(total, scale=scale))  # every other class at gap T
    hi = math.log(1.0 - 1.0 / m)
    lo = min(lo, hi)  # q̃ may be capped everywhere (few votes, large σ): RDP constant, cells 0
    edges = np.linspace(lo, hi, CELLS + 1)
    pts = np.concatenate([edges, np.clip(edges + d, lo, hi), np.clip(edges - d, lo, hi)])
    f = gnmax_rdp_at(pts, np.full(pts.shape, sigma), order)
    _check_monotone(np.sort(pts), f[np.argsort(pts)], sigma, order)
    f_e, f_up, f_down = f[: CELLS + 1], f[CELLS + 1 : 2 * CELLS + 2], f[2 * CELLS + 2 :]
    # for ℓ in [a, b]: RDP(ℓ + D) − RDP(ℓ) <= RDP(b + D) − RDP(a), RDP(ℓ) − RDP(ℓ − D) <= RDP(b) − RDP(a − D)
    cells = np.maximum(f_up[1:] - f_e[:-1], f_e[1:] - f_down[:-1])
    return edges, cells


def gnmax_ls_bounds(counts: np.ndarray, sigma: np.ndarray, order: float) -> np.ndarray:
    """U_r for r = 0..T (T votes per query): bounds on GNMax's local sensitivity at distance r, [T+1, Q]."""
    counts = np.asarray(counts, dtype=np.float64)
    n_q, m = counts.shape
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (n_q,))
    total = float(counts[0].sum())
    winner = counts.argmax(axis=1)
    gaps = counts[np.arange(n_q), winner][:, None] - counts  # [Q, m]
    r = np.arange(0, int(total) + 1, dtype=np.float64)[:, None, None]
    hi = np.maximum(0.0, gaps[None] - 2 * r)
    lo = np.minimum(gaps[None] + 2 * r, total)
    hi[:, np.arange(n_q), winner] = np.inf  # the winner's own term is left out of q̃
    lo[:, np.arange(n_q), winner] = np.inf
    lq_hi, lq_lo = gnmax.log_q_from_gaps(hi, sigma[None]), gnmax.log_q_from_gaps(lo, sigma[None])
    out = np.empty(lq_hi.shape)
    for s in np.unique(sigma):
        q = sigma == s
        edges, cells = _one_step_cells(float(s), order, total, m)
        k_lo = np.clip(np.searchsorted(edges, lq_lo[:, q], side="right") - 1, 0, CELLS - 1)
        k_hi = np.clip(np.searchsorted(edges, lq_hi[:, q], side="left") - 1, 0, CELLS - 1)
        k_hi = np.maximum(k_hi, k_lo)
        out[:, q] = _range_max(cells, k_lo.ravel(), k_hi.ravel()).reshape(k_lo.shape)
    return out


def _check_monotone(log_q: np.ndarray, f: np.ndarray, sigma: float, order: float) -> None:
    """The bounds need RDP(q̃) non-decreasing in q̃ (the paper's condition C5): check it on the grid."""
    if np.any(np.diff(f) < -1e-12):
        raise NotMonotoneError(
            f"GNMax's RDP bound at order {order} is not monotone in q for σ={sigma}: "
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
