"""Calibration, composition theorems and the top-down planner."""

import math

import numpy as np
import pytest

from dpfl.errors import PrivacyError
from dpfl.privacy import (
    Ledger,
    SampledGaussianEvent,
    ZCDPEvent,
    advanced_composition,
    advanced_composition_improved,
    amplify_by_sampling,
    amplify_by_sampling_tight,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    basic_composition,
    calibrate_sigma,
    cdp_to_zcdp,
    classic_gaussian_sigma,
    dp_to_zcdp,
    epsilon_for,
    gaussian_zcdp,
    laplace_scale,
    plan_top_down,
    pure_dp_to_zcdp,
    zcdp_to_dp,
)
from dpfl.privacy import rdp as R


def test_calibrate_rdp_is_tight_and_safe():
    for eps in (0.5, 2.0, 8.0):
        s = calibrate_sigma(eps, 1e-6, 0.01, 1000, "rdp")
        assert (
            epsilon_for(s, 0.01, 1000, 1e-6, "rdp")
            <= eps
            < epsilon_for(s * (1 - 5e-5), 0.01, 1000, 1e-6, "rdp")
        )


def test_calibrate_pld_thesis_setting():
    s = calibrate_sigma(1.0, 1e-5, 1 / 60, 200, "pld", rtol=1e-4)
    assert epsilon_for(s, 1 / 60, 200, 1e-5, "pld") <= 1.0
    assert epsilon_for(s * 0.999, 1 / 60, 200, 1e-5, "pld") > 1.0
    assert (
        s
        < calibrate_sigma(1.0, 1e-5, 1 / 60, 200, "rdp")
        < calibrate_sigma(1.0, 1e-5, 1 / 60, 200, "moments")
    )


def test_calibrate_rejects_bad_targets():
    for bad in (
        {"target_epsilon": 0},
        {"target_epsilon": -1},
        {"delta": 1.0},
        {"q": 0.0},
        {"steps": 0},
        {"accountant": "x"},
    ):
        args = {"target_epsilon": 1.0, "delta": 1e-5, "q": 0.01, "steps": 10, "accountant": "rdp"} | bad
        with pytest.raises(PrivacyError):
            calibrate_sigma(**args)


def test_top_down_planner_equals_moments_calibration_and_certifies():
    plan = plan_top_down(1.0, 1e-5, 200, 1 / 60)
    assert len(set(plan.sigmas)) == 1 and plan.lam * 1.0 > math.log(1e5)
    assert plan.sigmas[0] == pytest.approx(calibrate_sigma(1.0, 1e-5, 1 / 60, 200, "moments"), rel=2e-5)
    led = Ledger("moments")
    led.add(SampledGaussianEvent(plan.sigmas[0], 1 / 60), 200)
    assert led.epsilon(1e-5) <= 1.0 + 1e-12
    # unequal split: more budget to later steps -> smaller sigma there; the moments ledger still certifies
    w = np.repeat([1.0, 2.0, 3.0], 17)
    plan = plan_top_down(2.0, 1e-5, 51, 0.05, weights=w)
    assert plan.sigmas[0] > plan.sigmas[-1]
    led = Ledger("moments")
    for s in plan.sigmas:
        led.add(SampledGaussianEvent(s, 0.05))
    assert led.epsilon(1e-5) <= 2.0 * (1 + 1e-9)
    with pytest.raises(PrivacyError, match="too strict"):
        plan_top_down(0.1, 1e-10, 10)


def test_laplace_scale():
    assert laplace_scale(0.5, 2.0) == 4.0
    with pytest.raises(PrivacyError):
        laplace_scale(0.0)


def test_classic_gaussian_domain_and_formula():
    assert classic_gaussian_sigma(0.5, 1e-5, 2.0) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5
    )
    for bad in (1.0, 2.0, 0.0):
        with pytest.raises(PrivacyError, match=r"epsilon in \(0, 1\)"):
            classic_gaussian_sigma(bad, 1e-5)


def _hockey_stick(sigma, eps):
    """delta(eps) = int max(0, p(x) - e^eps q(x)) dx for N(0, s^2) vs N(1, s^2), by quadrature."""
    from scipy import integrate, stats

    x0 = 0.5 - eps * sigma**2  # p > e^eps q exactly for x < x0
    f = lambda x: stats.norm.pdf(x, 0, sigma) - math.exp(eps) * stats.norm.pdf(x, 1, sigma)
    return integrate.quad(f, x0 - 40 * sigma, x0, epsabs=0, epsrel=1e-10, limit=200)[0]


def test_analytic_gaussian_against_dp_accounting_and_quadrature():
    from dp_accounting import gaussian_mechanism

    for eps, delta in ((0.1, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-9), (10.0, 1e-3)):
        s = analytic_gaussian_sigma(eps, delta)
        assert s == pytest.approx(gaussian_mechanism.get_sigma_gaussian(eps, delta), rel=1e-6)
        assert analytic_gaussian_delta(s, eps) <= delta
        assert analytic_gaussian_delta(s, eps) == pytest.approx(_hockey_stick(s, eps), rel=1e-6)
        if eps < 1:
            assert s < classic_gaussian_sigma(eps, delta)
    assert analytic_gaussian_sigma(1.0, 1e-5, sensitivity=3.0) == pytest.approx(
        3 * analytic_gaussian_sigma(1.0, 1e-5)
    )


def test_composition_anchors_A35():
    # k = 100 queries of (0.1, 0)-DP, delta' = 1e-5 (DP notes A3.5)
    assert basic_composition(0.1, 0.0, 100) == pytest.approx((10.0, 0.0))
    adv, d = advanced_composition(0.1, 0.0, 100, 1e-5)
    imp, _ = advanced_composition_improved(0.1, 0.0, 100, 1e-5)
    assert round(adv, 3) == 5.850 and round(imp, 3) == 5.324 and d == 1e-5
    assert 10 > adv > imp


def test_improved_composition_dominates_the_zcdp_route():
    for eps in np.linspace(0.01, 2, 15):
        for k in (1, 10, 1000):
            imp, _ = advanced_composition_improved(float(eps), 0.0, k, 1e-6)
            zcdp = zcdp_to_dp(k * pure_dp_to_zcdp(float(eps)), 1e-6)  # k eps^2/2 + eps sqrt(2k ln 1/delta')
            assert imp >= zcdp - 1e-12
            assert imp <= advanced_composition(float(eps), 0.0, k, 1e-6)[0]


def test_amplification_by_sampling():
    assert amplify_by_sampling(0.5, 1e-6, 0.1) == pytest.approx((0.1, 1e-7))
    with pytest.raises(PrivacyError, match="epsilon <= 1"):
        amplify_by_sampling(1.5, 0.0, 0.1)
    for eps in np.linspace(0.01, 1, 10):
        for q in (0.001, 0.1, 1.0):
            assert (
                amplify_by_sampling_tight(float(eps), 0, q)[0]
                <= amplify_by_sampling(float(eps), 0, q)[0] + 1e-15
            )


def test_zcdp_conversions():
    rho, delta = 0.05, 1e-6
    assert zcdp_to_dp(rho, delta) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    assert zcdp_to_dp(dp_to_zcdp(1.3, delta), delta) == pytest.approx(1.3)
    led = Ledger("rdp")
    led.add(ZCDPEvent(rho))
    assert led.epsilon(delta) <= zcdp_to_dp(rho, delta)  # the RDP conversion is tighter
    assert pure_dp_to_zcdp(0.4) == pytest.approx(0.08)
    assert cdp_to_zcdp(0.3, 0.2) == pytest.approx((0.28, 0.02))
    orders = R.DEFAULT_ORDERS
    assert np.allclose(R.sampled_gaussian_rdp(1.0, 2.5, orders), gaussian_zcdp(2.5) * orders)


@pytest.mark.parametrize(
    "call",
    [
        lambda: advanced_composition(0.1, 0.0, 0, 1e-5),
        lambda: advanced_composition(0.1, 0.0, 10, 0.0),
        lambda: advanced_composition(-0.1, 0.0, 10, 1e-5),
        lambda: basic_composition(0.1, 1.0, 3),
        lambda: zcdp_to_dp(0.0, 1e-5),
        lambda: zcdp_to_dp(0.1, 1.0),
        lambda: cdp_to_zcdp(0.1, 0.0),
        lambda: amplify_by_sampling(0.5, 0.0, 0.0),
        lambda: gaussian_zcdp(0.0),
    ],
)
def test_theorem_domains_are_enforced(call):
    with pytest.raises(PrivacyError):
        call()
