"""Moments-accountant analysis of LNMax (Laplace noisy max), PATE 2017.

Each query adds Lap(1/γ) to every vote count and releases the argmax. One training record
changes one teacher's vote, so two counts move by one: the query is (2γ, 0)-DP.
Per query and moment l the log moment is bounded by the minimum of three bounds
(reference note A7.4):

* Theorem 2 (Dwork–Rothblum concentrated DP):  α(l) ≤ ½ (2γ)² l (l+1)
* the pure-DP bound:                          α(l) ≤ 2γ l
* Theorem 3 (data dependent, q = Pr[output ≠ plurality]), valid for q < (e^{2γ}−1)/(e^{4γ}−1):
  α(l) ≤ log((1−q)((1−q)/(1−e^{2γ}q))^l + q e^{2γl})

q is bounded from the vote counts by Lemma 4: q ≤ Σ_{i≠i*} (2 + γ·gap_i) / (4 e^{γ·gap_i}),
capped at 1 − 1/m. Moments compose by addition (Theorem 2.1) and ε = min_l (α(l) + ln(1/δ)) / l
(Theorem 2.2). The data-dependent ε depends on the raw votes, so it is released through
β-smooth sensitivity (Nissim–Raskhodnikova–Smith, Corollary 2.4).
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import PrivacyError


def _check_gamma(gamma: np.ndarray) -> np.ndarray:
    gamma = np.asarray(gamma, dtype=np.float64)
    if not np.all(np.isfinite(gamma)) or np.any(gamma <= 0):
        raise PrivacyError(f"LNMax noise parameter γ (Laplace scale 1/γ) must be > 0 and finite, got {gamma}")
    return gamma


def _check_counts(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim == 1:
        counts = counts[None, :]
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise PrivacyError(f"vote counts must have shape [queries, classes>=2], got {counts.shape}")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise PrivacyError("vote counts must be finite and non-negative")
    return counts


def q_bound(counts: np.ndarray, gamma: float | np.ndarray) -> np.ndarray:
    """Lemma 4: upper bound on Pr[noisy argmax ≠ plurality], per row of `counts` ([Q, m] or [m])."""
    counts = _check_counts(counts)
    gamma = np.broadcast_to(_check_gamma(gamma), (counts.shape[0],))
    winner = counts.argmax(axis=1)
    gaps = gamma[:, None] * (counts[np.arange(len(counts)), winner][:, None] - counts)
    terms = 0.25 * (gaps + 2.0) * np.exp(-gaps)
    terms[np.arange(len(counts)), winner] = 0.0
    m = counts.shape[1]
    return np.minimum(terms.sum(axis=1), 1.0 - 1.0 / m)


def theorem3_valid(q: np.ndarray, priv_eps: np.ndarray) -> np.ndarray:
    """Domain of Theorem 3 (PATE 2017): q < (e^ε − 1)/(e^{2ε} − 1) = 1/(e^ε + 1), ε = 2γ."""
    return np.asarray(q) < 1.0 / (np.exp(priv_eps) + 1.0)


def log_moment(q: np.ndarray, priv_eps: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Per-query log-moment bound, min of the three bounds; returns [Q, L] for q, priv_eps [Q], orders [L]."""
    q = np.atleast_1d(np.asarray(q, dtype=np.float64))[:, None]
    e = np.broadcast_to(np.atleast_1d(np.asarray(priv_eps, dtype=np.float64)), (q.shape[0],))[:, None]
    ls = np.asarray(orders, dtype=np.float64)[None, :]
    if np.any(q < 0) or np.any(q > 1):
        raise PrivacyError(f"q must lie in [0, 1], got {q.ravel()}")
    bound_cdp = 0.5 * e * e * ls * (ls + 1)
    bound_pure = e * ls
    best = np.minimum(bound_cdp, bound_pure)
    ok = theorem3_valid(q, e)[:, 0]
    if np.any(ok):
        qo, eo = q[ok], e[ok]
        with np.errstate(divide="ignore"):
            log_t1 = np.log1p(-qo) + ls * (np.log1p(-qo) - np.log1p(-np.exp(eo) * qo))
            log_t2 = np.log(qo) + eo * ls  # -inf when q = 0
        bound_dd = np.logaddexp(log_t1, log_t2)
        best[ok] = np.minimum(best[ok], bound_dd)
    return best


def log_moment_from_counts(counts: np.ndarray, gamma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Data-dependent per-query log moments [Q, L] from raw vote counts."""
    counts = _check_counts(counts)
    gamma = np.broadcast_to(_check_gamma(gamma), (counts.shape[0],))
    return log_moment(q_bound(counts, gamma), 2.0 * gamma, orders)


def data_independent_log_moment(gamma: float | np.ndarray, orders: np.ndarray) -> np.ndarray:
    """Per-query log moments with q = 1 (only the two data-independent bounds apply)."""
    gamma = np.atleast_1d(_check_gamma(gamma))
    return log_moment(np.ones_like(gamma), 2.0 * gamma, orders)


def epsilon_from_log_moments(total: np.ndarray, orders: np.ndarray, delta: float) -> tuple[float, int]:
    """Theorem 2.2 inverted: ε = min_l (α(l) + ln(1/δ)) / l. Returns (ε, index of the best order)."""
    if not 0 < delta < 1:
        raise PrivacyError(f"δ must lie in (0, 1), got {delta}")
    eps = (np.asarray(total) + math.log(1.0 / delta)) / np.asarray(orders, dtype=np.float64)
    i = int(np.argmin(eps))
    return float(eps[i]), i


# ---------------------------------------------------------------- smooth sensitivity
#
# The reference script's `smoothed_sens` only moves votes from the top class to the runner-up
# and stops at the first zero; brute force on small ensembles shows it can *underestimate* the
# β-smooth sensitivity (e.g. counts (0, 5, 7): 0 instead of 0.87), so its release is not DP.
# We use a bound that is provably an upper bound and β-smooth instead:
# within distance r (r teachers change their vote) every gap to the winner moves by at most 2r,
# so q̃ stays in [q_lo(r), q_hi(r)] with
#     q_hi(r) = min(1 − 1/m, Σ_{i≠i*} h(γ·max(0, gap_i − 2r))),
#     q_lo(r) = min(1 − 1/m, Σ_{i≠i*} h(γ·min(gap_i + 2r, T))),  h(g) = (2 + g) / (4 e^g),
# (T = number of votes), and, the log-moment bound α(q̃) being non-decreasing in q̃, the local
# sensitivity anywhere in the ball of radius r is at most U_r = α(q_hi(r+1)) − α(q_lo(r+1)). Both satisfy
# q_hi(n, r) ≤ q_hi(n', r+1) and q_lo(n, r) ≥ q_lo(n', r+1) for neighbours n, n' (also when the
# winner changes), so SS = max_r e^{−βr} U_r is a β-smooth upper bound (Nissim et al. Def. 2.1).


def _gap_sum(gaps: np.ndarray, winner: np.ndarray, m: int) -> np.ndarray:
    terms = 0.25 * (gaps + 2.0) * np.exp(-gaps)
    np.put_along_axis(terms, winner[..., None], 0.0, axis=-1)
    return np.minimum(terms.sum(axis=-1), 1.0 - 1.0 / m)


def smooth_sensitivity(
    counts: np.ndarray, gamma: float | np.ndarray, orders: np.ndarray, beta: float
) -> np.ndarray:
    """β-smooth upper bound on the local sensitivity of each query's log moment, [Q, L]."""
    counts = _check_counts(counts)
    gamma = np.broadcast_to(_check_gamma(gamma), (counts.shape[0],)).astype(np.float64)
    if not beta > 0:
        raise PrivacyError(f"smooth-sensitivity β must be > 0, got {beta}")
    n_q, m = counts.shape
    teachers = int(counts.sum(axis=1).max())
    per = max(1, 2_000_000 // ((teachers + 1) * m))  # queries per chunk: bounded memory
    if n_q > per:
        return np.concatenate(
            [
                smooth_sensitivity(counts[i : i + per], gamma[i : i + per], orders, beta)
                for i in range(0, n_q, per)
            ]
        )
    winner = counts.argmax(axis=1)
    gaps = counts[np.arange(n_q), winner][:, None] - counts  # [Q, m], >= 0
    r = np.arange(1, teachers + 2, dtype=np.float64)[:, None, None]  # r + 1 for r = 0..T
    g = gamma[None, :, None]
    q_hi = _gap_sum(g * np.maximum(0.0, gaps[None] - 2 * r), np.broadcast_to(winner, (len(r), n_q)), m)
    total = counts.sum(axis=1)[None, :, None]  # gaps never exceed the number of votes
    q_lo = _gap_sum(g * np.minimum(gaps[None] + 2 * r, total), np.broadcast_to(winner, (len(r), n_q)), m)
    eps2 = np.broadcast_to(2.0 * gamma, q_hi.shape)
    a_hi = log_moment(q_hi.ravel(), eps2.ravel(), orders).reshape(len(r), n_q, -1)
    a_lo = log_moment(q_lo.ravel(), eps2.ravel(), orders).reshape(len(r), n_q, -1)
    discount = np.exp(-beta * np.arange(len(r)))[:, None, None]
    return (discount * (a_hi - a_lo)).max(axis=0)


def smooth_release_parameters(
    beta: float, delta: float, *, reference_code: bool = False
) -> tuple[float, float]:
    """(ss_eps, ss_scale): releasing f + Lap(1)·ss_scale·SS, SS a β-smooth bound, is (ss_eps, δ)-DP.

    Corollary 2.4 (Nissim et al. 2007) needs β ≤ ε / (2 ln(2/δ)), so ss_eps = 2β ln(2/δ).
    `reference_code=True` reproduces the PATE script's ln(1/δ) (note A7.8), which is slightly
    smaller than the corollary allows; use it only to compare with published numbers.
    """
    if beta <= 0 or not 0 < delta < 1:
        raise PrivacyError(f"need β > 0 and δ in (0, 1), got β={beta}, δ={delta}")
    ss_eps = 2.0 * beta * math.log((1.0 if reference_code else 2.0) / delta)
    return ss_eps, 2.0 / ss_eps
