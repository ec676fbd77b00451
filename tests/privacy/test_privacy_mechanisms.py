"""Mechanisms: output distributions at fixed seeds and privacy ratios from exact probabilities."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from dpfl.errors import PrivacyError
from dpfl.privacy import mechanisms as M
from dpfl.rng import CryptoRNG

RNGS = [lambda: np.random.default_rng(7), lambda: CryptoRNG(key=b"m" * 32)]


@pytest.mark.parametrize("rng", RNGS)
def test_laplace_and_gaussian_noise_distributions(rng):
    r = rng()
    assert stats.kstest(M.laplace_noise(50_000, 1.7, r), "laplace", args=(0, 1.7)).pvalue > 1e-3
    assert stats.kstest(M.gaussian_noise(50_000, 2.2, r), "norm", args=(0, 2.2)).pvalue > 1e-3
    v = np.array([1.0, -2.0, 3.5])
    assert M.laplace_mechanism(v, 0.5, r).shape == (3,)
    out = np.array([M.gaussian_mechanism(v, 0.1, r) for _ in range(2000)])
    assert np.allclose(out.mean(axis=0), v, atol=0.02)


@pytest.mark.parametrize("n", [1, 2, 7, 131_073])
def test_gaussian_noise_is_the_one_sampler_of_the_others(n):
    """One Gaussian in dpfl: the mechanism's noise equals pate.noise.gaussian and
    CryptoRNG.gaussian_into bit for bit (the sampler itself: tests/privacy/test_noise_stream.py)."""
    from dpfl.pate.noise import gaussian

    want = CryptoRNG(key=b"q" * 32).gaussian_into(torch.empty(n, dtype=torch.float64), 0.7).numpy()
    assert np.array_equal(M.gaussian_noise(n, 0.7, CryptoRNG(key=b"q" * 32)), want)
    assert np.array_equal(gaussian(CryptoRNG(key=b"q" * 32), n, 0.7), want)


def test_same_seed_same_noise():
    a = M.gaussian_noise(100, 1.0, CryptoRNG(key=bytes(32)))
    b = M.gaussian_noise(100, 1.0, CryptoRNG(key=bytes(32)))
    assert np.array_equal(a, b)


def _lap_pdf(x, b):
    return math.exp(-abs(x) / b) / (2 * b)


def _lap_cdf(x, b):
    return 0.5 * math.exp(x / b) if x < 0 else 1 - 0.5 * math.exp(-x / b)


def _quad(f, centre, width):
    return integrate.quad(f, centre - width, centre + width, limit=400, epsabs=1e-13, points=[centre])[0]


def rnm_probs(v, b):
    return np.array(
        [
            _quad(
                lambda x, i=i: (
                    _lap_pdf(x - v[i], b) * np.prod([_lap_cdf(x - v[j], b) for j in range(len(v)) if j != i])
                ),
                v[i],
                60 * b,
            )
            for i in range(len(v))
        ]
    )


def test_report_noisy_max_distribution_and_privacy():
    v, eps = np.array([1.0, 2.0, 0.0, 2.5]), 1.0
    b = 2 / eps
    p = rnm_probs(v, b)
    assert p.sum() == pytest.approx(1, abs=1e-8)
    r = CryptoRNG(key=b"r" * 32)
    draws = np.array([M.report_noisy_max(v, eps, 1.0, r) for _ in range(6000)])
    assert stats.chisquare(np.bincount(draws, minlength=4), p * draws.size).pvalue > 1e-3
    g = np.random.default_rng(0)
    for _ in range(5):  # neighbouring inputs: every value moves by at most the sensitivity
        q = rnm_probs(v + g.uniform(-1, 1, v.size), b)
        assert np.all(p <= math.exp(eps) * q * (1 + 1e-6)) and np.all(q <= math.exp(eps) * p * (1 + 1e-6))


def at_probs(q, T, eps):
    """Exact output distribution of AboveThreshold: index 0..k-1, then k for None."""
    bt, bq = 2 / eps, 4 / eps

    def prob(i):
        def f(tau):
            below = np.prod([_lap_cdf(tau - q[j], bq) for j in range(i)])
            return _lap_pdf(tau - T, bt) * below * ((1 - _lap_cdf(tau - q[i], bq)) if i < len(q) else 1.0)

        return _quad(f, T, 60 * bq)

    return np.array([prob(i) for i in range(len(q) + 1)])


def test_above_threshold_distribution_and_privacy():
    q, T, eps = np.array([0.5, 2.0, 1.0, 3.0]), 2.5, 1.0
    p = at_probs(q, T, eps)
    assert p.sum() == pytest.approx(1, abs=1e-8)
    r = np.random.default_rng(3)
    out = [M.above_threshold(q, T, eps, 1.0, r) for _ in range(6000)]
    counts = np.bincount([len(q) if o is None else o for o in out], minlength=len(q) + 1)
    assert stats.chisquare(counts, p * len(out)).pvalue > 1e-3
    g = np.random.default_rng(1)
    for _ in range(5):
        p2 = at_probs(q + g.choice([-1.0, 1.0], q.size), T, eps)
        assert np.all(p <= math.exp(eps) * p2 * (1 + 1e-6)) and np.all(p2 <= math.exp(eps) * p * (1 + 1e-6))


def test_sparse_vector_c_answers():
    q = np.array([0.0, 10.0, 0.0, 10.0, 10.0, 0.0])
    out = M.sparse_vector(q, 5.0, 50.0, 2, 1.0, np.random.default_rng(0))
    assert out == [1, 3]  # tiny noise at eps=50: the first two above-threshold queries, then halt
    # with c = 1 it consumes randomness exactly like AboveThreshold
    for s in range(20):
        a = M.above_threshold(q, 5.0, 0.7, 1.0, np.random.default_rng(s))
        b = M.sparse_vector(q, 5.0, 0.7, 1, 1.0, np.random.default_rng(s))
        assert b == ([] if a is None else [a])
    with pytest.raises(PrivacyError, match="c "):
        M.sparse_vector(q, 5.0, 1.0, 0)


def test_exponential_mechanism_distribution_stability_and_privacy():
    u, eps = np.array([3.0, 1.0, 2.0, 0.0]), 1.5
    p = np.exp(eps * u / 2) / np.exp(eps * u / 2).sum()
    assert np.allclose(M.exponential_mechanism_probs(u, eps), p, rtol=1e-12)
    r = CryptoRNG(key=b"e" * 32)
    draws = np.array([M.exponential_mechanism(u, eps, 1.0, r) for _ in range(6000)])
    assert stats.chisquare(np.bincount(draws, minlength=4), p * draws.size).pvalue > 1e-3
    big = M.exponential_mechanism_probs(u * 1e9 + 1e15, eps / 1e9)  # huge utilities: no overflow
    assert np.all(np.isfinite(big)) and np.allclose(big, p, rtol=1e-6)
    g = np.random.default_rng(2)
    for _ in range(20):
        p2 = M.exponential_mechanism_probs(u + g.uniform(-1, 1, u.size), eps)
        assert np.all(p <= math.exp(eps) * p2 * (1 + 1e-12))
    assert np.allclose(
        M.exponential_mechanism_probs(u, eps, monotonic=True), np.exp(eps * u) / np.exp(eps * u).sum()
    )


def test_randomized_response_is_ln3_dp_and_unbiased():
    assert M.rr_keep_probability(math.log(3)) == pytest.approx(0.5)
    r = CryptoRNG(key=b"q" * 32)
    yes = M.randomized_response(np.ones(40_000, dtype=bool), rng=r)
    no = M.randomized_response(np.zeros(40_000, dtype=bool), rng=r)
    assert stats.binomtest(int(yes.sum()), yes.size, 0.75).pvalue > 1e-3
    assert stats.binomtest(int(no.sum()), no.size, 0.25).pvalue > 1e-3
    # estimator: unbiased (mean over repeats within 4 standard errors), 2*mean - 1/2 at ln 3
    truth = np.random.default_rng(0).random(2000) < 0.3
    est = [M.rr_estimate(M.randomized_response(truth, rng=r)) for _ in range(300)]
    se = np.std(est) / math.sqrt(len(est))
    assert abs(np.mean(est) - truth.mean()) < 4 * se
    resp = M.randomized_response(truth, rng=r)
    assert M.rr_estimate(resp) == pytest.approx(2 * resp.mean() - 0.5)
    with pytest.raises(PrivacyError, match="boolean"):
        M.randomized_response(np.array([0, 1]), rng=r)


def test_mechanism_argument_checks():
    r = np.random.default_rng(0)
    for call in (
        lambda: M.laplace_noise(3, 0.0, r),
        lambda: M.gaussian_mechanism([np.nan], 1.0, r),
        lambda: M.report_noisy_max([], 1.0, 1.0, r),
        lambda: M.exponential_mechanism([1.0], 0.0, 1.0, r),
        lambda: M.above_threshold([1.0], 0.0, -1.0, 1.0, r),
        lambda: M.laplace_noise(3, 1.0, r, secure=True),
    ):
        with pytest.raises(PrivacyError):
            call()
