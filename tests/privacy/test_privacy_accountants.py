"""Accountants against the thesis numbers, direct integration, and dp-accounting."""

import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpfl.privacy import (
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    SampledGaussianEvent,
    ZCDPEvent,
    calibrate_sigma,
    epsilon_for,
)
from dpfl.privacy import rdp as R

# Tier-1 accountant table (reference/kerkouche-thesis-numbers.md section 9): sigma, q, T, eps
TIER1 = [
    (1.54, 1 / 60, 200, 1.00),
    (1.54, 1 / 60, 25, 0.69),
    (1.54, 1 / 60, 60, 0.76),
    (1.54, 1 / 60, 101, 0.84),
    (1.54, 1 / 60, 150, 0.92),
    (1.54, 1 / 60, 152, 0.92),
    (1.54, 1 / 60, 157, 0.93),
    (1.54, 1 / 60, 160, 0.94),
    (1.54, 1 / 60, 167, 0.95),
    (1.54, 1 / 60, 187, 0.98),
    (1.54, 1 / 60, 189, 0.98),
    (1.54, 1 / 60, 195, 0.99),
    (1.54, 1 / 60, 196, 0.99),
    (1.49, 100 / 5011, 100, 1.00),
    (1.49, 100 / 5011, 93, 0.99),
    (1.49, 100 / 5011, 64, 0.92),
    (1.49, 100 / 5010, 23, 0.79),
    (1.49, 100 / 5010, 37, 0.84),
    (1.49, 100 / 5010, 53, 0.89),
    (1.49, 100 / 5010, 62, 0.91),
    (1.49, 100 / 5010, 85, 0.97),
    (1.49, 100 / 5010, 90, 0.98),
    (5.0, 100 / 5011, 100, 0.39),
]


@pytest.mark.parametrize("sigma,q,T,eps", TIER1)
def test_moments_reproduces_thesis_tier1_table(sigma, q, T, eps):
    assert round(epsilon_for(sigma, q, T, 1e-5, "moments"), 2) == eps


def test_moments_inverse_problem_sigma_for_eps_1_2_4():
    got = [calibrate_sigma(e, 1e-5, 1 / 60, 200, "moments") for e in (1, 2, 4)]
    assert [round(s, 2) for s in got] == [1.54, 1.08, 0.81]
    for e, s in zip((1, 2, 4), got):
        assert (
            epsilon_for(s, 1 / 60, 200, 1e-5, "moments")
            <= e
            < epsilon_for(s * (1 - 1e-4), 1 / 60, 200, 1e-5, "moments")
        )


def _alpha_by_quadrature(q, sigma, lam):
    """alpha(lam) = log max(E1, E2) of Eq. 5.2 by quadrature, in log space:
    E1 = int eta0 (eta1/eta0)^-lam, E2 = int eta0 (eta1/eta0)^(lam+1),
    eta1/eta0 = (1-q) + q exp((2x-1)/(2 sigma^2))."""

    def log_ratio(x):
        return np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))

    def integrand(power):
        return lambda x: math.exp(stats.norm.logpdf(x, 0, sigma) + power * log_ratio(x))

    lim = 40 * sigma + 2 * lam + 10
    pts = [0.0, 1.0, float(lam + 1)]
    e1 = integrate.quad(integrand(-lam), -lim, lim, points=pts, limit=500, epsabs=0, epsrel=1e-10)[0]
    e2 = integrate.quad(integrand(lam + 1), -lim, lim, points=pts, limit=500, epsabs=0, epsrel=1e-10)[0]
    return math.log(max(e1, e2)), e1, e2


@pytest.mark.parametrize("q,sigma", [(1 / 60, 1.54), (100 / 5011, 5.0), (0.1, 2.0), (0.5, 3.0)])
def test_moments_closed_form_A53_matches_numerical_integration(q, sigma):
    curve = R.leaf_rdp(SampledGaussianEvent(sigma, q), R.MOMENTS_ORDERS, "add_remove")
    for lam in (1, 4, 17, 32):
        ref, e1, e2 = _alpha_by_quadrature(q, sigma, lam)
        assert e1 <= e2 * (1 + 1e-9)  # E2 dominates (MTZ19), so alpha = log A_{lam+1}
        if abs(ref) > 1e-12:
            assert lam * curve[lam - 1] == pytest.approx(ref, rel=1e-7)


def test_moments_q1_is_plain_gaussian():
    lam = R.MOMENTS_LAMBDAS
    curve = R.leaf_rdp(SampledGaussianEvent(2.0, 1.0), R.MOMENTS_ORDERS, "add_remove")
    assert np.allclose(lam * curve, lam * (lam + 1) / (2 * 2.0**2), rtol=1e-14)


def _random_sets(seed, n):
    g = np.random.default_rng(seed)
    for _ in range(n):
        yield (
            float(g.uniform(0.6, 6.0)),
            float(10 ** g.uniform(-3, -0.3)),
            int(g.integers(1, 2000)),
            float(10 ** g.uniform(-9, -3)),
        )


def test_rdp_agrees_with_dp_accounting_on_50_random_sets():
    from dp_accounting import dp_event as E
    from dp_accounting.rdp import rdp_privacy_accountant as D

    orders = R.DEFAULT_ORDERS[::10]  # fractional and integer orders; dp-accounting is slow per order
    assert np.any(orders != np.round(orders)) and np.any(orders == np.round(orders))
    for sigma, q, T, delta in _random_sets(0, 50):
        led = Ledger("rdp", orders=orders)
        led.add(SampledGaussianEvent(sigma, q), T)
        ref = D.RdpAccountant(orders=list(orders))
        ref.compose(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(sigma)), T)
        assert led.epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=1e-6), (sigma, q, T, delta)
        e = ref.get_epsilon(delta)
        assert led.delta(e) == pytest.approx(ref.get_delta(e), rel=1e-6)


def test_pld_agrees_with_dp_accounting_on_50_random_sets():
    from dp_accounting import dp_event as E
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    g = np.random.default_rng(1)
    for _ in range(50):  # moderate sets: each PLD costs a few ms at discretization 5e-3
        sigma, q, T = float(g.uniform(0.8, 4.0)), float(10 ** g.uniform(-2.5, -0.5)), int(g.integers(1, 300))
        delta = float(10 ** g.uniform(-8, -3))
        led = Ledger("pld", pld_discretization=5e-3)
        led.add(SampledGaussianEvent(sigma, q), T)
        ref = PLDAccountant(value_discretization_interval=5e-3)
        ref.compose(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(sigma)), T)
        assert led.epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=1e-6), (sigma, q, T, delta)


def test_heterogeneous_ledgers_agree_with_dp_accounting():
    from dp_accounting import dp_event as E
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.rdp import rdp_privacy_accountant as D

    ours = [
        (SampledGaussianEvent(1.1, 0.02), 50),
        (GaussianEvent(8.0), 3),
        (LaplaceEvent(20.0), 4),
        (SampledGaussianEvent(2.0, 0.1), 20),
    ]
    theirs = [
        (E.PoissonSampledDpEvent(0.02, E.GaussianDpEvent(1.1)), 50),
        (E.GaussianDpEvent(8.0), 3),
        (E.LaplaceDpEvent(20.0), 4),
        (E.PoissonSampledDpEvent(0.1, E.GaussianDpEvent(2.0)), 20),
    ]
    orders = R.DEFAULT_ORDERS[::5]
    for name, acc in (
        ("rdp", D.RdpAccountant(orders=list(orders))),
        ("pld", PLDAccountant(value_discretization_interval=1e-3)),
    ):
        led = Ledger(name, orders=orders) if name == "rdp" else Ledger(name, pld_discretization=1e-3)
        for (ev, k), (ref_ev, kk) in zip(ours, theirs):
            led.add(ev, k)
            acc.compose(ref_ev, kk)
        assert led.epsilon(1e-6) == pytest.approx(acc.get_epsilon(1e-6), rel=1e-6)


def test_rdp_curves_of_other_events_match_dp_accounting():
    from dp_accounting import dp_event as E
    from dp_accounting.rdp import rdp_privacy_accountant as D

    orders = R.DEFAULT_ORDERS
    for ours, theirs in (
        (GaussianEvent(1.3), E.GaussianDpEvent(1.3)),
        (LaplaceEvent(0.7), E.LaplaceDpEvent(0.7)),
        (ZCDPEvent(0.05, 0.01), E.ZCDpEvent(0.05, 0.01)),
    ):
        acc = D.RdpAccountant(orders=list(orders))
        acc.compose(theirs)
        assert np.allclose(R.leaf_rdp(ours, orders, "add_remove"), acc.rdp, rtol=1e-9, atol=0)


def test_conversions_match_dp_accounting_on_random_curves():
    from dp_accounting.rdp import rdp_privacy_accountant as D

    g = np.random.default_rng(2)
    orders = R.DEFAULT_ORDERS
    for _ in range(30):
        curve = np.cumsum(g.uniform(0, 0.05, orders.size)) * g.uniform(0.1, 5)
        delta, eps = float(10 ** g.uniform(-9, -2)), float(g.uniform(0.1, 8))
        assert R.epsilon_from_rdp(orders, curve, delta)[0] == pytest.approx(
            D.compute_epsilon(orders, curve, delta)[0], rel=1e-12
        )
        assert R.delta_from_rdp(orders, curve, eps)[0] == pytest.approx(
            D.compute_delta(orders, curve, eps)[0], rel=1e-12
        )


def test_backends_order_and_thesis_setting_B():
    e = {a: epsilon_for(1.54, 1 / 60, 200, 1e-5, a) for a in ("moments", "rdp", "pld")}
    assert e["pld"] < e["rdp"] < e["moments"]
    assert round(e["moments"], 2) == 1.00


def test_epsilon_and_delta_are_inverse():
    for acc in ("moments", "rdp"):
        led = Ledger(acc)
        led.add(SampledGaussianEvent(1.2, 0.01), 300)
        eps = led.epsilon(1e-6)
        assert led.delta(eps) <= 1e-6 * (1 + 1e-9)
        assert led.delta(eps * 0.98) > 1e-6
