"""ε from canary guesses: Steinke, Nasr & Jagielski's one-run lower bound and Andrew et al.'s estimate.

One run, m canaries, each included independently with probability 1/2. The auditor guesses "in" for
the k₊ highest scores and "out" for the k₋ lowest, abstaining on the rest: r = k₊ + k₋ guesses of which
v are correct. If the mechanism is (ε, δ)-DP with respect to every canary (Steinke et al. 2023, Theorem
3 with δ > 0; Theorem 1 for δ = 0), with p = e^ε / (1 + e^ε) and B ~ Binomial(r, p),

    P[v correct] ≤ P[B ≥ v] + 2mδ · max_{i = 1..v} P[v − i ≤ B < v] / i.

The right side is the p-value of "the mechanism is (ε, δ)-DP" given v; it grows with ε. The lower bound
at confidence 1 − β is the largest ε whose p-value is still ≤ β (every smaller ε is rejected too), 0
when even ε = 0 is not rejected. The tail is the exact binomial one (scipy's regularized incomplete
beta), not a normal approximation.

Choosing (k₊, k₋) after seeing the scores would make the bound invalid; `one_run_bound` tests a fixed
grid of choices and pays for it with a Bonferroni split of β (the best of G choices, each at β/G).

Andrew et al. (2024) estimate ε instead of bounding it: fit one Gaussian to the scores of the included
canaries and one to the excluded, and report the ε at which those two Gaussians are (ε, δ)-close
(`gaussian_epsilon`). An estimate, not a bound: no confidence attaches to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

_EPS_MAX = 60.0  # e^60 / (1 + e^60) is 1 in float64: no bound can go past it


def p_value(m: int, r: int, v: int, eps: float, delta: float = 0.0) -> float:
    """P-value of "(ε, δ)-DP" given v correct out of r guesses on m canaries (the module's formula)."""
    _check_counts(m, r, v)
    if v == 0:
        return 1.0
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, p)  # P[B ≥ v]
    if delta == 0:
        return float(min(1.0, tail))
    i = np.arange(1, v + 1)
    between = stats.binom.sf(v - i - 1, r, p) - tail  # P[v − i ≤ B < v]
    return float(min(1.0, tail + 2 * m * delta * float(np.max(between / i))))


def epsilon_lower_bound(m: int, r: int, v: int, confidence: float = 0.95, delta: float = 0.0) -> float:
    """The largest ε rejected at this confidence: p_value(ε) ≤ 1 − confidence (0 if ε = 0 is not rejected)."""
    _check_counts(m, r, v)
    beta = _check_confidence(confidence)
    if p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while hi < _EPS_MAX and p_value(m, r, v, hi, delta) <= beta:
        lo, hi = hi, 2 * hi
    if hi >= _EPS_MAX and p_value(m, r, v, _EPS_MAX, delta) <= beta:
        return _EPS_MAX
    for _ in range(100):  # bisection: p_value is monotone in ε
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9:
            break
    return lo


def count_guesses(scores: np.ndarray, included: np.ndarray, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(r, v): guess "in" for the k_pos highest scores, "out" for the k_neg lowest (ties broken by index)."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    m = len(scores)
    if included.shape != (m,):
        raise ValueError(f"scores ({m}) and included ({included.shape}) differ in length")
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > m:
        raise ValueError(f"k₊ = {k_pos} and k₋ = {k_neg} must be ≥ 0 with k₊ + k₋ ≤ m = {m}")
    order = np.argsort(scores, kind="stable")
    high, low = order[m - k_pos:] if k_pos else order[:0], order[:k_neg]
    return k_pos + k_neg, int(included[high].sum() + (~included[low]).sum())


def guess_grid(m: int) -> list[tuple[int, int]]:
    """The default (k₊, k₋) choices: r ≈ 2%, 5%, 10%, 20% and 40% of m guesses, split evenly between the
    highest and the lowest scores, and the same numbers of "in" guesses alone."""
    out = []
    for f in (0.02, 0.05, 0.1, 0.2, 0.4):
        k = max(1, round(f * m / 2))
        out += [(k, k), (2 * k, 0)]
    return sorted({(a, b) for a, b in out if a + b <= m})


@dataclass
class OneRunBound:
    epsilon: float  # the lower bound (max over the grid, each choice tested at β / len(grid))
    k_pos: int
    k_neg: int
    guesses: int  # r
    correct: int  # v
    confidence: float
    delta: float
    choices: int  # len(grid): the Bonferroni factor

    def as_dict(self) -> dict:
        return dict(vars(self))


def one_run_bound(scores: np.ndarray, included: np.ndarray, confidence: float = 0.95, delta: float = 0.0,
                  grid: Sequence[tuple[int, int]] | None = None) -> OneRunBound:
    """Steinke et al.'s lower bound for the best (k₊, k₋) of `grid` (default `guess_grid`), each tested at
    confidence 1 − β/len(grid): the reported bound holds at `confidence` whichever choice won."""
    m = len(scores)
    grid = guess_grid(m) if grid is None else [tuple(g) for g in grid]
    if not grid:
        raise ValueError("no (k₊, k₋) choice to test")
    beta = _check_confidence(confidence)
    each = 1 - beta / len(grid)
    best = None
    for k_pos, k_neg in grid:
        r, v = count_guesses(scores, included, k_pos, k_neg)
        eps = epsilon_lower_bound(m, r, v, each, delta)
        if best is None or eps > best.epsilon:
            best = OneRunBound(eps, k_pos, k_neg, r, v, confidence, delta, len(grid))
    return best


# ---- Andrew et al.: ε of two fitted Gaussians -------------------------------------------------------

def _region_mass(mu: float, s: float, a: float, b: float, c: float) -> float:
    """P[a·x² + b·x + c > 0] for x ~ N(μ, s²)."""
    d = stats.norm(mu, s)
    if a == 0:
        if b == 0:
            return 1.0 if c > 0 else 0.0
        t = -c / b
        return float(d.sf(t) if b > 0 else d.cdf(t))
    disc = b * b - 4 * a * c
    if disc <= 0:
        return 1.0 if a > 0 else 0.0
    root = math.sqrt(disc)
    lo, hi = sorted(((-b - root) / (2 * a), (-b + root) / (2 * a)))
    if a > 0:  # outside the roots
        return float(d.cdf(lo) + d.sf(hi))
    return float(d.sf(lo) - d.sf(hi)) if lo > mu else float(d.cdf(hi) - d.cdf(lo))


def _delta_one_way(mu1: float, s1: float, mu0: float, s0: float, eps: float) -> float:
    """δ(ε) of P = N(μ1, s1²) against Q = N(μ0, s0²): P[L > ε] − e^ε Q[L > ε], L = log dP/dQ."""
    a = 1 / (2 * s0**2) - 1 / (2 * s1**2)
    b = mu1 / s1**2 - mu0 / s0**2
    c = mu0**2 / (2 * s0**2) - mu1**2 / (2 * s1**2) + math.log(s0 / s1) - eps
    return max(0.0, _region_mass(mu1, s1, a, b, c) - math.exp(eps) * _region_mass(mu0, s0, a, b, c))


def gaussian_delta(mu1: float, s1: float, mu0: float, s0: float, eps: float) -> float:
    """The δ at which N(μ1, s1²) and N(μ0, s0²) are (ε, δ)-indistinguishable (both directions)."""
    return max(_delta_one_way(mu1, s1, mu0, s0, eps), _delta_one_way(mu0, s0, mu1, s1, eps))


def gaussian_epsilon(mu1: float, s1: float, mu0: float, s0: float, delta: float) -> float:
    """The smallest ε with gaussian_delta(ε) ≤ δ (0 if ε = 0 already qualifies)."""
    if not (s1 > 0 and s0 > 0):
        raise ValueError(f"standard deviations must be > 0, got {s1} and {s0}")
    if gaussian_delta(mu1, s1, mu0, s0, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(mu1, s1, mu0, s0, hi) > delta:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        if gaussian_delta(mu1, s1, mu0, s0, mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9:
            break
    return hi


def andrew_estimate(scores: np.ndarray, included: np.ndarray, delta: float) -> dict:
    """Andrew et al.'s ε estimate: Gaussians fitted to the included and excluded canaries' scores."""
    scores, included = np.asarray(scores, dtype=np.float64), np.asarray(included, dtype=bool)
    s_in, s_out = scores[included], scores[~included]
    if len(s_in) < 2 or len(s_out) < 2:
        raise ValueError("the estimate needs at least 2 included and 2 excluded canaries")
    mu1, sd1, mu0, sd0 = s_in.mean(), s_in.std(ddof=1), s_out.mean(), s_out.std(ddof=1)
    return {"epsilon": gaussian_epsilon(mu1, sd1, mu0, sd0, delta), "mean_in": float(mu1), "std_in": float(sd1),
            "mean_out": float(mu0), "std_out": float(sd0), "delta": delta}


def _check_counts(m: int, r: int, v: int) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 ≤ v ≤ r ≤ m, got m = {m}, r = {r}, v = {v}")


def _check_confidence(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return 1 - confidence
