"""The pld accountant's numpy PLDs (dpfl.privacy.pld) against dp-accounting computed directly.

Issue 40: the PLD for 10,000 rounds at the same epsilon as before (to 1e-6 relative) and pessimistic.
The ledger used to call dp-accounting's from_gaussian_mechanism / self_compose / get_epsilon_for_delta;
these tests compute exactly that in the test and compare. (Times: `dpfl bench privacy`; no timed test.)
"""

import math

import numpy as np
import pytest

from dpfl.privacy import pld
from dpfl.privacy.calibration import epsilon_for
from dpfl.privacy.events import GaussianEvent, LaplaceEvent, SampledGaussianEvent
from dpfl.privacy.ledger import Ledger


def _reference(sigma, q, steps, dx):
    from dp_accounting.pld import privacy_loss_distribution as P

    p = P.from_gaussian_mechanism(sigma, value_discretization_interval=dx, sampling_prob=q)
    return p.self_compose(steps) if steps > 1 else p


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "delta"),
    [
        (1.54, 1 / 60, 10_000, 1e-5),  # the workload (`dpfl bench privacy`)
        (1.0, 0.01, 1000, 1e-6),  # `dpfl bench cli`'s command
        (3.0, 0.001, 3000, 1e-8),
        (2.0, 1.0, 100, 1e-5),  # no sampling: one symmetric pmf
    ],
)
def test_ledger_epsilon_matches_dp_accounting_at_the_default_discretization(sigma, q, steps, delta):
    ref = _reference(sigma, q, steps, 1e-4)
    eps = epsilon_for(sigma, q, steps, delta, "pld")  # the ledger at its default discretization, 1e-4
    assert eps == pytest.approx(float(ref.get_epsilon_for_delta(delta)), rel=1e-6, abs=0)
    led = Ledger("pld")
    led.add(SampledGaussianEvent(sigma, q) if q < 1 else GaussianEvent(sigma), steps)
    for e in (0.5 * eps, eps, 2 * eps):
        assert led.delta(e) == pytest.approx(float(ref.get_delta_for_epsilon(e)), rel=1e-5, abs=1e-15)


@pytest.mark.parametrize(("sigma", "q", "dx"), [(1.54, 1 / 60, 1e-4), (0.7, 0.3, 1e-3), (4.0, 0.002, 1e-3),
                                                (1.3, 1.0, 1e-3)])
def test_leaf_pmfs_are_dp_accountings(sigma, q, dx):
    """The connect-the-dots pmfs of one round: the same grid, infinity mass and probabilities."""
    ref = pld.from_dp_accounting(_reference(sigma, q, 1, dx))
    ours = pld.gaussian(sigma, q, dx)
    assert ours.symmetric == ref.symmetric == (q == 1)
    for a, b in ((ours.remove, ref.remove), (ours.add, ref.add)) if q < 1 else ((ours.remove, ref.remove),):
        assert (a.lower, a.probs.size) == (b.lower, b.probs.size)
        assert a.inf == pytest.approx(b.inf, rel=1e-12)
        np.testing.assert_allclose(a.probs, b.probs, rtol=1e-10, atol=1e-300)


def _random_pmf(g, dx, n):
    probs = g.dirichlet(np.full(n, 0.3)) * (1 - 1e-9)
    return int(g.integers(-n, n // 4)), probs, 1e-9


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # dp-accounting's scan, not ours
def test_pmf_algebra_matches_dp_accountings_dense_pmf():
    """Self-composition's window and values, composition with truncation, eps(delta) and delta(eps)."""
    from dp_accounting.pld.pld_pmf import DensePLDPmf

    g = np.random.default_rng(7)
    for _ in range(20):
        dx = float(g.choice([1e-3, 1e-2]))
        a, b = _random_pmf(g, dx, int(g.integers(2, 3000))), _random_pmf(g, dx, int(g.integers(2, 300)))
        ours = [pld.Pmf(dx, lo, p.copy(), inf) for lo, p, inf in (a, b)]
        ref = [DensePLDPmf(dx, lo, p.copy(), inf, True) for lo, p, inf in (a, b)]
        k = int(g.integers(2, 60))
        pairs = [(ours[0].self_compose(k), ref[0].self_compose(k)), (ours[0].compose(ours[1]), ref[0].compose(ref[1]))]
        for o, r in pairs:
            assert (o.lower, o.probs.size) == (r._lower_loss, r.size)
            assert o.inf == pytest.approx(r._infinity_mass, rel=1e-12)
            np.testing.assert_allclose(o.probs, r._probs, rtol=0, atol=1e-14)
            for delta in (1e-3, 1e-6, 1e-8):  # equal to FFT rounding (~1e-16 per point, either way)
                assert o.epsilon(delta) == pytest.approx(r.get_epsilon_for_delta(delta), rel=1e-6, abs=1e-12)
            for eps in (0.0, 0.3, 2.0):
                assert o.delta(eps) == pytest.approx(r.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-13)
    tiny, tiny_ref = pld.Pmf(1e-2, 0, np.array([0.5, 0.499]), 1e-3), DensePLDPmf(1e-2, 0, np.array([0.5, 0.499]), 1e-3, True)
    assert tiny.epsilon(1e-4) == tiny_ref.get_epsilon_for_delta(1e-4) == math.inf
    assert tiny.epsilon(1e-3) == pytest.approx(tiny_ref.get_epsilon_for_delta(1e-3), rel=1e-12)
    assert tiny.epsilon(0.9) == tiny_ref.get_epsilon_for_delta(0.9) == 0


def test_other_leaves_still_come_from_dp_accounting():
    """Laplace (and pure/approximate DP, replace-one Gaussians) are built by dp-accounting and composed with
    the numpy Gaussians; this ledger matches dp-accounting's PLD accountant."""
    from dp_accounting import dp_event as E
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    led, acc = Ledger("pld", pld_discretization=1e-3), PLDAccountant(value_discretization_interval=1e-3)
    for ours, theirs, k in ((SampledGaussianEvent(1.2, 0.05), E.PoissonSampledDpEvent(0.05, E.GaussianDpEvent(1.2)),
                             200), (LaplaceEvent(10.0), E.LaplaceDpEvent(10.0), 3)):
        led.add(ours, k)
        acc.compose(theirs, k)
    assert led.epsilon(1e-6) == pytest.approx(acc.get_epsilon(1e-6), rel=1e-6)
