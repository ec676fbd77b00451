"""PATE analysis against the reference note's anchors and independent references."""

import itertools
import math

import numpy as np
import pytest
from pate_reference import gauss, laplace, neighbours, noisy_max_probs

from dpfl.errors import DpflError
from dpfl.pate import analyze, gnmax, lnmax, vote_counts
from dpfl.rng import Seeds

L8 = np.arange(1, 9, dtype=float)


# ------------------------------------------------------------------ anchors (note A3.5, A7, A9, C3)


@pytest.mark.parametrize(
    "queries, gamma, delta, eps, order",
    [(100, 0.05, 1e-5, 5.3026, 5), (1000, 0.05, 1e-6, 21.908, 2), (100, 0.1, 1e-5, 11.756, 2)],
)
def test_data_independent_anchors(queries, gamma, delta, eps, order):
    counts = np.tile([250, 0, 0], (queries, 1))
    r = analyze(counts, noise=gamma, delta=delta)
    assert r.eps_data_independent == pytest.approx(eps, abs=1e-3)
    assert r.order_data_independent == order
    # closed form min_l [Q·min(2γ²l(l+1), 2γl) + ln(1/δ)] / l
    closed = min(
        (queries * min(2 * gamma**2 * l * (l + 1), 2 * gamma * l) + math.log(1 / delta)) / l
        for l in range(1, 9)
    )
    assert r.eps_data_independent == pytest.approx(closed, abs=1e-12)


def test_anchor_moments_beats_advanced_composition():
    """Note A3.5: 100 × (0.1, 0)-DP, δ' = 1e-5.

    basic 10 > advanced 5.850 > improved 5.324 > moments 5.3026."""
    k, e, d = 100, 0.1, 1e-5
    adv = math.sqrt(2 * k * math.log(1 / d)) * e + k * e * (math.exp(e) - 1)
    imp = math.sqrt(2 * k * math.log(1 / d)) * e + k * e * (math.exp(e) - 1) / 2
    mom = analyze(np.tile([9, 1], (k, 1)), noise=e / 2, delta=d).eps_data_independent
    assert (round(adv, 3), round(imp, 3), round(mom, 4)) == (5.850, 5.324, 5.3026)
    assert k * e > adv > imp > mom


@pytest.mark.parametrize("delta, ss_eps, ss_scale", [(1e-5, 2.0723, 0.9651), (1e-6, 2.4868, 0.8043)])
def test_smooth_release_parameters(delta, ss_eps, ss_scale):
    e, s = lnmax.smooth_release_parameters(0.09, delta, reference_code=True)
    assert (e, s) == (pytest.approx(ss_eps, abs=1e-4), pytest.approx(ss_scale, abs=1e-4))
    e2, s2 = lnmax.smooth_release_parameters(0.09, delta)  # Corollary 2.4: ln(2/δ)
    assert e2 == pytest.approx(2 * 0.09 * math.log(2 / delta), rel=1e-12) and e2 > e
    assert s2 == pytest.approx(2 / e2, rel=1e-12)


# ------------------------------------------------------------------ soundness against exact probabilities

CASES = [([8, 1, 1], 0.5), ([20, 3, 2], 0.3), ([5, 4, 1], 0.5), ([10, 0, 0], 1.0), ([30, 5, 5], 0.1)]


@pytest.mark.parametrize("counts, gamma", CASES)
def test_lnmax_bounds_dominate_exact_moments(counts, gamma):
    p = noisy_max_probs(counts, laplace(gamma))
    q_exact = 1 - p[int(np.argmax(counts))]
    assert lnmax.q_bound(np.array(counts), gamma)[0] >= q_exact - 1e-12  # Lemma 4
    bound = lnmax.log_moment_from_counts(np.array(counts), gamma, L8)[0]
    for nb in neighbours(counts):
        p2 = noisy_max_probs(nb, laplace(gamma))
        exact = np.log([np.sum(p * (p / p2) ** l) for l in L8])
        assert np.all(exact <= bound + 1e-9), (nb, exact, bound)
    di = np.minimum(2 * gamma**2 * L8 * (L8 + 1), 2 * gamma * L8)
    assert np.all(bound <= di + 1e-12)


def test_q_bound_cap_and_log_moment_monotone():
    counts = np.array([[3, 3, 3, 3], [10, 0, 0, 0]])
    q = lnmax.q_bound(counts, 0.05)
    assert q[0] == pytest.approx(0.75) and q[1] <= 0.75
    grid = np.linspace(0, 1, 2001)
    for eps in (0.05, 0.1, 0.5, 2.0):
        a = lnmax.log_moment(grid, np.full_like(grid, eps), L8)
        assert np.all(np.diff(a, axis=0) >= -1e-12)  # non-decreasing in q (used by the smooth bound)


def test_heterogeneous_noise_composes_by_addition():
    counts = np.array([[40, 5, 5]] * 30 + [[20, 15, 15]] * 20)
    gam = np.array([0.05] * 30 + [0.2] * 20)
    r = analyze(counts, noise=gam, delta=1e-5)
    a1 = lnmax.log_moment_from_counts(counts[:1], 0.05, L8)[0]
    a2 = lnmax.log_moment_from_counts(counts[30:31], 0.2, L8)[0]
    expect = min((30 * a1 + 20 * a2 + math.log(1e5)) / L8)
    assert r.eps_data_dependent == pytest.approx(expect, rel=1e-12)
    assert r.eps_data_dependent <= r.eps_data_independent


# ------------------------------------------------------------------ smooth sensitivity (brute force)


def _all_counts(teachers, m):
    return [c for c in itertools.product(range(teachers + 1), repeat=m) if sum(c) == teachers]


def _brute_smooth(teachers, m, gamma, order, beta):
    vs = _all_counts(teachers, m)
    pos = {v: i for i, v in enumerate(vs)}
    f = lnmax.log_moment_from_counts(np.array(vs, float), gamma, [order])[:, 0]
    nbs = [[pos[tuple(w)] for w in neighbours(v)] for v in vs]
    ls = np.array([max(abs(f[j] - f[i]) for j in nb) for i, nb in enumerate(nbs)])
    out = np.zeros(len(vs))
    for i in range(len(vs)):
        seen, frontier, a = {i}, {i}, ls[i]
        out[i] = a
        for k in range(1, teachers + 1):
            frontier = {w for u in frontier for w in nbs[u]} - seen
            seen |= frontier
            if frontier:
                a = max(a, ls[list(frontier)].max())
            out[i] = max(out[i], math.exp(-beta * k) * a)
    return vs, nbs, out


@pytest.mark.parametrize("gamma, order", [(0.5, 2), (0.3, 4), (1.0, 2)])
def test_smooth_sensitivity_is_a_smooth_upper_bound(gamma, order):
    beta = 0.09
    vs, nbs, exact = _brute_smooth(9, 3, gamma, order, beta)
    ours = lnmax.smooth_sensitivity(np.array(vs, float), gamma, [order], beta)[:, 0]
    assert np.all(ours >= exact - 1e-12)
    assert exact.max() > 0.1  # the case is not trivial
    for i, nb in enumerate(nbs):  # β-smooth: S(n) <= e^β S(n')
        assert np.all(ours[i] <= math.exp(beta) * ours[nb] + 1e-12)


def test_smooth_release_is_reproducible_and_noisy():
    counts = vote_counts(np.r_[np.zeros((200, 60), int), np.ones((50, 60), int)], 10)
    a = analyze(counts, noise=0.05, rng=Seeds(3).crypto("release"))
    b = analyze(counts, noise=0.05, rng=Seeds(3).crypto("release"))
    c = analyze(counts, noise=0.05, rng=Seeds(4).crypto("release"))
    assert a.eps_data_dependent_released == b.eps_data_dependent_released != c.eps_data_dependent_released
    assert a.smooth_sensitivity > 0 and a.eps_data_dependent < a.eps_data_independent


# ------------------------------------------------------------------ GNMax


def test_gnmax_data_independent_matches_dp_accounting():
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant

    orders = np.arange(2, 64, dtype=float)
    sigma, queries = 40.0, 300
    ours = gnmax.rdp_data_independent(np.full(queries, sigma), orders).sum(axis=0)
    acc = RdpAccountant(orders=list(orders))
    acc.compose(SelfComposedDpEvent(GaussianDpEvent(sigma / math.sqrt(2)), queries))  # l2 sensitivity √2
    assert np.allclose(ours, acc._rdp, rtol=1e-12)


@pytest.mark.parametrize("counts, sigma", [([30, 2, 1], 4.0), ([40, 10, 0], 6.0), ([60, 0, 0], 8.0)])
def test_gnmax_bounds_dominate_exact_renyi(counts, sigma):
    orders = np.array([1.5, 2.0, 3.0, 5.0, 8.0])
    p = noisy_max_probs(counts, gauss(sigma))
    lq = gnmax.log_q_bound(np.array([counts]), sigma)[0]
    assert lq >= math.log(1 - p[int(np.argmax(counts))]) - 1e-9  # Prop. 7
    bound = gnmax.rdp_data_dependent([lq], sigma, orders)[0]
    assert np.all(bound <= orders / sigma**2 + 1e-15)
    for nb in neighbours(counts):
        p2 = noisy_max_probs(nb, gauss(sigma))
        exact = np.array([np.log(np.sum(p**a * p2 ** (1 - a))) / (a - 1) for a in orders])
        assert np.all(exact <= bound + 1e-9)
    if counts == [60, 0, 0]:
        assert np.all(bound < orders / sigma**2)  # the data-dependent bound is used


# ------------------------------------------------------------------ inputs


def test_vote_counts_and_input_errors():
    preds = np.array([[0, 1, 2], [0, 1, 1], [2, 1, 1]])
    assert vote_counts(preds, 3).tolist() == [[2, 0, 1], [0, 3, 0], [0, 2, 1]]
    with pytest.raises(DpflError, match="outside"):
        vote_counts(preds, 2)
    counts = vote_counts(preds, 3)
    with pytest.raises(DpflError, match="rows in"):
        analyze(counts, indices=np.array([3]))
    with pytest.raises(DpflError, match="one entry per queried index"):
        analyze(counts, indices=np.array([0, 1]), labels=np.array([0]))
    with pytest.raises(DpflError, match="mechanism"):
        analyze(counts, mechanism="expmech")
    with pytest.raises(DpflError, match="one value per query"):
        analyze(counts, noise=np.array([0.1, 0.2]))
    r = analyze(counts, indices=np.array([0, 1]), labels=np.array([0, 2]))
    assert r.label_agreement == 0.5 and r.queries == 2 and r.teachers == 3


@pytest.mark.parametrize("queries, delta", [(100, 1e-5), (1000, 1e-6)])
def test_data_independent_matches_the_ledgers_moments_accountant(queries, delta):
    from dpfl.privacy.events import PureDPEvent
    from dpfl.privacy.ledger import Ledger

    led = Ledger("moments")
    led.add(PureDPEvent(2 * 0.05), count=queries)  # each LNMax query is (2γ, 0)-DP
    r = analyze(np.tile([200, 50], (queries, 1)), noise=0.05, delta=delta)
    assert r.eps_data_independent == pytest.approx(led.epsilon(delta), abs=1e-9)
