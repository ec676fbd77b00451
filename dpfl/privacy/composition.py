"""Composition and conversion theorems, each with its domain enforced, and the notes'
top-down budget planner.

Sources: DP notes (seed 002) A3, A5.3, A6.1; survey (seed 000) 3.3 and its errata; Dwork-Roth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.privacy import rdp as R
from dpfl.privacy.events import check_count, check_delta, check_q


def _eps(v, name="epsilon", allow_zero=True) -> float:
    ok = (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v >= 0 if allow_zero else v > 0)
    )
    if not ok:
        raise PrivacyError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {v!r}")
    return float(v)


def _delta0(v, name="delta") -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise PrivacyError(f"{name} must be in [0, 1), got {v!r}")
    return float(v)


def basic_composition(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """k-fold composition of (eps, delta)-DP: (k eps, k delta) (delta capped at 1)."""
    e, d, k = _eps(epsilon), _delta0(delta), check_count(k, "k")
    return k * e, min(1.0, k * d)


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """Dwork-Rothblum-Vadhan 2010 (Dwork-Roth Thm 3.20): k-fold adaptive composition is
    (sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1), k delta + delta')-DP."""
    e, d, k = _eps(epsilon), _delta0(delta), check_count(k, "k")
    dp = check_delta(delta_prime, "delta_prime")
    return math.sqrt(2 * k * math.log(1 / dp)) * e + k * e * math.expm1(e), min(1.0, k * d + dp)


def advanced_composition_improved(
    epsilon: float, delta: float, k: int, delta_prime: float
) -> tuple[float, float]:
    """The DP notes' "improved advanced composition" (seed 002, A3.4; no citation there):
    eps' = sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1)/2.

    Valid: it only replaces Dwork-Roth's bound eps(e^eps - 1) on the expected privacy loss
    by eps(e^eps - 1)/2, which still dominates the tight bound eps tanh(eps/2)
    (Kairouz-Oh-Viswanath 2015; Bun-Steinke 2016 give eps^2/2).
    """
    e, d, k = _eps(epsilon), _delta0(delta), check_count(k, "k")
    dp = check_delta(delta_prime, "delta_prime")
    return math.sqrt(2 * k * math.log(1 / dp)) * e + k * e * math.expm1(e) / 2, min(1.0, k * d + dp)


def amplify_by_sampling(epsilon: float, delta: float, q: float) -> tuple[float, float]:
    """Beimel et al. 2010 Lemma 4 as in the notes: eps-DP (eps <= 1) run on a q-sample is
    (2 q eps, q delta)-DP. Raises outside eps <= 1."""
    e, d, q = _eps(epsilon), _delta0(delta), check_q(q)
    if e > 1:
        raise PrivacyError(
            f"amplification by sampling (2 q eps) needs epsilon <= 1, got {e}; "
            "use amplify_by_sampling_tight for larger epsilon"
        )
    return 2 * q * e, q * d


def amplify_by_sampling_tight(epsilon: float, delta: float, q: float) -> tuple[float, float]:
    """Poisson sampling, add/remove neighbours (Balle-Barthe-Gaboardi 2018):
    (log(1 + q (e^eps - 1)), q delta); any eps >= 0."""
    e, d, q = _eps(epsilon), _delta0(delta), check_q(q)
    return math.log1p(q * math.expm1(e)), q * d


def zcdp_to_dp(rho: float, delta: float) -> float:
    """Bun-Steinke 2016 Prop. 1.3: rho-zCDP => (rho + 2 sqrt(rho ln(1/delta)), delta)-DP."""
    r = _eps(rho, "rho", allow_zero=False)
    d = check_delta(delta)
    return r + 2 * math.sqrt(r * math.log(1 / d))


def dp_to_zcdp(epsilon: float, delta: float) -> float:
    """Largest rho whose zcdp_to_dp(rho, delta) equals epsilon (the inverse, for budgeting):
    rho = (sqrt(eps + ln(1/delta)) - sqrt(ln(1/delta)))^2."""
    e = _eps(epsilon, allow_zero=False)
    L = math.log(1 / check_delta(delta))
    return (math.sqrt(e + L) - math.sqrt(L)) ** 2


def pure_dp_to_zcdp(epsilon: float) -> float:
    """Bun-Steinke 2016 Prop. 1.4: eps-DP => (eps^2/2)-zCDP. (The survey's eps(e^eps-1)/2 is
    Dwork-Rothblum's CDP mean, an erratum.)"""
    return _eps(epsilon) ** 2 / 2


def cdp_to_zcdp(mu: float, tau: float) -> tuple[float, float]:
    """(mu, tau)-CDP => (mu - tau^2/2, tau^2/2)-zCDP, as (xi, rho) (survey 1.20 / Bun-Steinke)."""
    m, t = _eps(mu, "mu"), _eps(tau, "tau", allow_zero=False)
    return m - t * t / 2, t * t / 2


def gaussian_zcdp(sigma: float, sensitivity: float = 1.0) -> float:
    """The Gaussian mechanism is (sensitivity^2 / (2 sigma^2))-zCDP."""
    return _eps(sensitivity, "sensitivity", False) ** 2 / (2 * _eps(sigma, "sigma", False) ** 2)


# ---- the notes' top-down planner (A6.1) ---------------------------------------------------


@dataclass(frozen=True)
class TopDownPlan:
    sigmas: tuple[float, ...]  # per-step noise multipliers
    lam: int  # the moment order the plan is built on
    alpha_ref: float  # alpha_r(lam) = lam eps + ln delta, split over the steps


def _sigma_for_alpha(alpha: float, lam: int, q: float) -> float:
    """sigma with alpha(lam | q, sigma) = alpha (exact log-moment A5.3; decreasing in sigma)."""
    order = np.array([lam + 1.0])
    f = lambda x: R.sampled_gaussian_rdp(q, math.exp(x), order)[0] * lam - alpha
    lo, hi = -5.0, 5.0
    while f(hi) > 0:
        hi += 5
    while f(lo) < 0:
        lo -= 5
    from scipy.optimize import brentq  # here: importing scipy.optimize slows every `dpfl privacy` start

    s = math.exp(brentq(f, lo, hi, xtol=1e-13))
    while f(math.log(s)) > 0:
        s *= 1 + 1e-12
    return s


def plan_top_down(
    target_epsilon: float, delta: float, steps: int, q: float = 1.0, weights=None
) -> TopDownPlan:
    """Notes A6.1: alpha_r(lam) = lam eps + ln delta; split it over the steps (by ``weights``,
    default equal) so that sum_i alpha_i(lam) = alpha_r(lam) (Thm 2.1 composition, Thm 2.2 tail
    bound), solve each alpha_i for sigma_i, and keep the integer lam in 1..32 with the smallest
    largest sigma_i. The moments accountant then certifies the target for the planned steps.
    """
    e = _eps(target_epsilon, allow_zero=False)
    d = check_delta(delta)
    n = check_count(steps, "steps")
    q = check_q(q)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise PrivacyError(f"weights must be {n} finite positive numbers")
    w = w / w.sum()
    best = None
    for lam in range(1, 33):
        alpha_ref = lam * e + math.log(d)
        if alpha_ref <= 0:  # needs lam > ln(1/delta)/eps
            continue
        uniq = {float(x): _sigma_for_alpha(alpha_ref * x, lam, q) for x in np.unique(w)}
        sig = tuple(uniq[float(x)] for x in w)
        if best is None or max(sig) < max(best.sigmas):
            best = TopDownPlan(sig, lam, alpha_ref)
    if best is None:
        raise PrivacyError(f"no lam <= 32 has lam*eps > ln(1/delta) (eps={e}, delta={d}): target too strict")
    return best
