"""The one-run bound against independent computations of Steinke et al.'s formula, and the two-Gaussian ε
of Andrew et al.'s estimate against numerical integration."""

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from dpfl.audit.bound import (
    andrew_estimate,
    count_guesses,
    epsilon_lower_bound,
    gaussian_delta,
    gaussian_epsilon,
    guess_grid,
    one_run_bound,
    p_value,
)


def _pvalue_direct(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Steinke et al.'s p-value from the binomial pmf summed term by term (no survival functions)."""
    p = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(r + 1)]
    tail = sum(pmf[v:])
    if delta == 0:
        return min(1.0, tail)
    below = [0.0, *itertools.accumulate(pmf[:v])]  # below[j] = P[B < j]
    worst = max((below[v] - below[v - i]) / i for i in range(1, v + 1))
    return min(1.0, tail + 2 * m * delta * worst)


def _bound_by_grid(m: int, r: int, v: int, beta: float, delta: float, step: float = 1e-4) -> float:
    """The largest ε on a grid of `step` whose direct p-value is ≤ β (0 if none): a scan at 100·step, then
    one at `step` from the last coarse point that passed (the p-value grows with ε)."""
    if _pvalue_direct(m, r, v, 0.0, delta) > beta:
        return 0.0
    start = 0
    while start < 200_000 and _pvalue_direct(m, r, v, (start + 100) * step, delta) <= beta:
        start += 100
    k = start
    while _pvalue_direct(m, r, v, (k + 1) * step, delta) <= beta:
        k += 1
    return k * step


CASES = [(1000, 100, 81, 0.0), (1000, 100, 81, 1e-5), (1000, 400, 389, 1e-5), (200, 20, 20, 0.0),
         (200, 20, 20, 1e-4), (5000, 50, 46, 1e-6), (100, 60, 40, 0.0)]


@pytest.mark.parametrize("m,r,v,delta", CASES)
def test_bound_matches_direct_binomial_search(m, r, v, delta):
    mine = epsilon_lower_bound(m, r, v, 0.95, delta)
    grid = _bound_by_grid(m, r, v, 0.05, delta)
    assert mine >= grid - 1e-9
    assert mine < grid + 1e-4 + 1e-9
    if mine > 0:
        assert _pvalue_direct(m, r, v, mine - 1e-7, delta) <= 0.05
    assert _pvalue_direct(m, r, v, mine + 2e-4, delta) > 0.05


@pytest.mark.parametrize("m,r,v,delta", CASES)
def test_p_value_matches_direct_sum(m, r, v, delta):
    for eps in (0.0, 0.5, 1.7, 3.0):
        assert p_value(m, r, v, eps, delta) == pytest.approx(_pvalue_direct(m, r, v, eps, delta), rel=1e-9, abs=1e-15)


def test_all_correct_without_delta_is_closed_form():
    # P[Binomial(r, p) ≥ r] = p^r = β  ⇒  p = β^(1/r), ε = log(p / (1 − p))
    for r in (5, 50, 400):
        p = 0.05 ** (1 / r)
        assert epsilon_lower_bound(1000, r, r, 0.95, 0.0) == pytest.approx(math.log(p / (1 - p)), abs=1e-7)


def test_bound_orders():
    assert epsilon_lower_bound(1000, 100, 90, 0.95) > epsilon_lower_bound(1000, 100, 80, 0.95)
    assert epsilon_lower_bound(1000, 100, 90, 0.95, 1e-5) < epsilon_lower_bound(1000, 100, 90, 0.95, 0.0)
    assert epsilon_lower_bound(1000, 100, 90, 0.99) < epsilon_lower_bound(1000, 100, 90, 0.95)
    assert epsilon_lower_bound(1000, 100, 50, 0.95) == 0.0  # chance level: nothing rejected


def test_count_guesses_by_hand():
    scores = np.array([0.9, -1.0, 0.3, 2.0, -0.5, 0.1])
    included = np.array([True, False, False, True, True, False])
    assert count_guesses(scores, included, 2, 0) == (2, 2)  # 2.0 and 0.9: both in
    assert count_guesses(scores, included, 0, 2) == (2, 1)  # -1.0 out (right), -0.5 in (wrong)
    assert count_guesses(scores, included, 3, 2) == (5, 3)  # + 0.3: out (wrong)
    with pytest.raises(ValueError):
        count_guesses(scores, included, 4, 3)


def test_one_run_bound_is_the_bonferroni_best_of_its_grid():
    rng = np.random.default_rng(0)
    inc = rng.random(600) < 0.5
    scores = rng.normal(size=600) + 1.5 * inc
    grid = guess_grid(600)
    got = one_run_bound(scores, inc, 0.95, 1e-5)
    expect = []
    for kp, kn in grid:
        order = np.argsort(scores)
        guessed_in, guessed_out = order[len(order) - kp:] if kp else order[:0], order[:kn]
        v = int(inc[guessed_in].sum() + (~inc[guessed_out]).sum())
        expect.append(_bound_by_grid(600, kp + kn, v, 0.05 / len(grid), 1e-5, step=1e-3))
    assert got.choices == len(grid)
    assert max(expect) - 1e-9 <= got.epsilon < max(expect) + 1e-3


def _gdp_delta(mu: float, eps: float) -> float:
    """Balle & Wang's δ(ε) of the Gaussian mechanism with sensitivity/σ = μ."""
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5])
def test_gaussian_epsilon_equal_variances_is_the_gaussian_mechanism(mu):
    eps = gaussian_epsilon(mu, 1.0, 0.0, 1.0, 1e-5)
    assert _gdp_delta(mu, eps) == pytest.approx(1e-5, rel=1e-5)


@pytest.mark.parametrize("m1,s1,m0,s0,eps", [(0.5, 1.2, 0.0, 1.0, 1.0), (1.0, 0.8, 0.2, 1.0, 0.5),
                                              (0.0, 1.5, 0.0, 1.0, 2.0)])
def test_gaussian_delta_matches_integration(m1, s1, m0, s0, eps):
    p, q = stats.norm(m1, s1).pdf, stats.norm(m0, s0).pdf
    one = integrate.quad(lambda x: max(0.0, p(x) - math.exp(eps) * q(x)), -40, 40, limit=400, points=[m0, m1])[0]
    other = integrate.quad(lambda x: max(0.0, q(x) - math.exp(eps) * p(x)), -40, 40, limit=400, points=[m0, m1])[0]
    assert gaussian_delta(m1, s1, m0, s0, eps) == pytest.approx(max(one, other), rel=1e-5, abs=1e-12)


def test_andrew_estimate_recovers_a_gaussian_mechanism():
    rng = np.random.default_rng(1)
    inc = rng.random(400_000) < 0.5
    scores = rng.normal(size=inc.size) + 1.0 * inc
    truth = optimize.brentq(lambda e: _gdp_delta(1.0, e) - 1e-3, 0, 20)
    assert andrew_estimate(scores, inc, 1e-3)["epsilon"] == pytest.approx(truth, rel=0.05)
