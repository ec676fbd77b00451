"""Lattice samplers: exact (CKS20) and fast table samplers, tested against the exact pmf."""

import bisect
import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dpfl.errors import PrivacyError
from dpfl.privacy import samplers as S
from dpfl.privacy.mechanisms import (
    discrete_gaussian,
    discrete_gaussian_exact,
    discrete_laplace,
    discrete_laplace_exact,
    discrete_laplace_tv_bound,
    sampler_tv_bound,
)
from dpfl.rng import CryptoRNG


def dg_pmf(mu, sigma, lo, hi):
    x = np.arange(lo, hi + 1)
    w = np.exp(-((x - mu) ** 2) / (2 * sigma**2))
    full = np.arange(math.floor(mu - 60 * sigma - 5), math.ceil(mu + 60 * sigma + 5))
    return x, w / np.exp(-((full - mu) ** 2) / (2 * sigma**2)).sum()


def chi2_pvalue(samples, x, p, min_expected=5):
    """Chi-square goodness of fit, pooling sparse bins into the two tails."""
    n = samples.size
    counts = np.array([np.count_nonzero(samples == v) for v in x], dtype=float)
    keep = p * n >= min_expected
    obs = np.append(counts[keep], n - counts[keep].sum())
    exp = np.append(p[keep] * n, n * (1 - p[keep].sum()))
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.parametrize(
    "mu,sigma",  # small fractions keep the exact arithmetic fast; one float case
    [(0.3, 1.7), (Fraction(-5, 2), Fraction(3, 5)), (4, Fraction(2)), (Fraction(1, 2), Fraction(33, 10))],
)
def test_exact_discrete_gaussian_real_mean_goodness_of_fit(mu, sigma):
    x = discrete_gaussian_exact(mu, sigma, np.random.default_rng(11), size=2000)
    mu, sigma = float(mu), float(sigma)
    xs, p = dg_pmf(mu, sigma, math.floor(mu - 8 * sigma) - 1, math.ceil(mu + 8 * sigma) + 1)
    assert chi2_pvalue(x, xs, p) > 1e-3
    assert abs(x.mean() - (xs * p).sum()) < 5 * sigma / math.sqrt(x.size)


def test_exact_sampler_uses_parameters_exactly_and_is_reproducible():
    a = discrete_gaussian_exact(Fraction(1, 3), Fraction(7, 5), CryptoRNG(key=bytes(32)), size=200)
    b = discrete_gaussian_exact(Fraction(1, 3), Fraction(7, 5), CryptoRNG(key=bytes(32)), size=200)
    assert np.array_equal(a, b)
    assert isinstance(discrete_gaussian_exact(0.2, 1.0, np.random.default_rng(0)), int)


def test_exact_discrete_laplace_goodness_of_fit():
    scale = 1.7
    x = discrete_laplace_exact(Fraction(17, 10), np.random.default_rng(3), size=4000)
    xs = np.arange(-40, 41)
    p = np.exp(-np.abs(xs) / scale)
    p /= p.sum()
    assert chi2_pvalue(x, xs, p) > 1e-3


@pytest.mark.parametrize("sigma", [0.7, 3.0, 198.6])
@pytest.mark.parametrize("rng", [lambda: np.random.default_rng(5), lambda: CryptoRNG(key=b"k" * 32)])
def test_fast_discrete_gaussian_goodness_of_fit(sigma, rng):
    x = discrete_gaussian(0, sigma, rng(), size=400_000)
    if sigma > 50:  # bin the lattice into 200 equal-probability groups of atoms
        xs, p = dg_pmf(0, sigma, -int(8 * sigma), int(8 * sigma))
        edges = np.searchsorted(np.cumsum(p), np.linspace(0, 1, 201)[1:-1])
        obs = np.bincount(np.searchsorted(xs[edges], x, side="right"), minlength=200)
        exp = np.add.reduceat(p, np.concatenate([[0], edges + 1]))[:200] * x.size
        exp *= x.size / exp.sum()
        assert stats.chisquare(obs, exp).pvalue > 1e-3
    else:
        xs, p = dg_pmf(0, sigma, -int(12 * sigma) - 2, int(12 * sigma) + 2)
        assert chi2_pvalue(x, xs, p) > 1e-3
    assert x.var() == pytest.approx((xs**2 * p).sum(), rel=0.02)


def test_fast_matches_exact_sampler_two_sample():
    sigma = 2.3
    fast = discrete_gaussian(0, sigma, np.random.default_rng(1), size=50_000)
    exact = discrete_gaussian_exact(0, Fraction(23, 10), np.random.default_rng(2), size=3000)
    vals = np.arange(-9, 10)
    f = np.array([np.count_nonzero(np.clip(fast, -9, 9) == v) for v in vals])
    e = np.array([np.count_nonzero(np.clip(exact, -9, 9) == v) for v in vals])
    assert stats.chi2_contingency(np.vstack([f, e])).pvalue > 1e-3


def test_fast_sampler_integer_means_and_shapes():
    mu = np.array([[0, 5], [-7, 1000]], dtype=np.int64)
    rng = np.random.default_rng(0)
    out = discrete_gaussian(np.repeat(mu[None], 20_000, axis=0), 1.5, rng)
    assert out.shape == (20_000, 2, 2) and out.dtype == np.int64
    assert np.allclose(out.mean(axis=0), mu, atol=0.05)
    assert discrete_gaussian(np.int64(3), 1.0, rng).shape == ()
    with pytest.raises(PrivacyError, match="integers"):
        discrete_gaussian(np.array([0.5]), 1.0, rng)
    a = discrete_gaussian(np.arange(1000), 4.0, CryptoRNG(key=b"s" * 32))
    b = discrete_gaussian(np.arange(1000), 4.0, CryptoRNG(key=b"s" * 32))
    assert np.array_equal(a, b)


def _exact_pmf_decimal(sigma, K):
    getcontext().prec = 60
    s2 = Decimal(Fraction(sigma).numerator) ** 2 / Decimal(Fraction(sigma).denominator) ** 2
    full = range(-K - int(40 * sigma) - 10, K + int(40 * sigma) + 11)
    w = {x: (Decimal(-x * x) / (2 * s2)).exp() for x in full}
    Z = sum(w.values())
    return {x: w[x] / Z for x in full}


@pytest.mark.parametrize("sigma", [0.7, 3.0])
def test_table_total_variation_within_stated_bound(sigma):
    t = S._gaussian_table(sigma)
    cdf = [(int(h) << 64) | int(lo) for h, lo in zip(t.c_hi, t.c_lo)]
    cdf = [0] + cdf + [1 << 128] * (2 * t.K + 1 - len(cdf))
    exact = _exact_pmf_decimal(sigma, t.K)
    tv = Decimal(0)
    for i, x in enumerate(range(-t.K, t.K + 1)):
        tv += abs(Decimal(cdf[i + 1] - cdf[i]) / Decimal(2**128) - exact[x])
    tv += sum(p for x, p in exact.items() if abs(x) > t.K)
    tv /= 2
    assert float(tv) <= sampler_tv_bound(sigma)
    assert sampler_tv_bound(sigma) < 1e-30


class _StubSource(S.Source):
    """Deterministic bits: the given 32-bit words, then constant fill words for the exact path."""

    def __init__(self, words, fill):
        self.words, self.fill, self.crypto = np.asarray(words, dtype=np.uint32), fill, True

    def uint32(self, n):
        if self.words is not None:
            w, self.words = self.words, None
            assert w.size == n
            return w
        return np.full(n, self.fill & 0xFFFFFFFF, dtype=np.uint32)

    def uint64(self, n):
        return np.full(n, self.fill, dtype=np.uint64)

    def words32_reader(self, chunk):
        return self.uint32


@pytest.mark.parametrize("kernel", ["c", "numpy"])
@pytest.mark.parametrize("sigma", [0.7, 3.0, 40.0])
def test_table_decisions_match_the_128bit_cdf_exactly(sigma, kernel, monkeypatch):
    """For words at every in-cell threshold (and random ones) the output is #{C_k <= u}: by the
    C kernel's lookup (where built) and by the NumPy one."""
    if kernel == "c" and S._kernel() is None:
        pytest.skip("C kernel not built")
    if kernel == "numpy":
        monkeypatch.setattr(S, "_kernel", lambda: None)
    t = S._gaussian_table(sigma)
    cdf = [(int(h) << 64) | int(lo) for h, lo in zip(t.c_hi, t.c_lo)]
    L = t.L
    words = set(np.random.default_rng(0).integers(0, 1 << 32, 2000).tolist())
    for c in cdf:  # words just below, at and just above each boundary's top 32 bits
        top = c >> 96
        words.update(w for w in (top - 1, top, top + 1) if 0 <= w < (1 << 32))
    words = np.array(sorted(words), dtype=np.uint32)
    for fill in (0, (1 << 64) - 1):  # the 96 fresh bits all zero / all one
        out = np.empty(words.size, dtype=np.int64)
        t.sample_into(out, _StubSource(words, fill))
        low96 = 0 if fill == 0 else (1 << 96) - 1
        expect = [bisect.bisect_right(cdf, (int(w) << 96) + low96) - t.K for w in words.tolist()]
        assert out.tolist() == expect, (sigma, fill, L)


def test_fast_discrete_laplace_goodness_of_fit_and_bound():
    scale = 2.5
    x = discrete_laplace(0, scale, np.random.default_rng(9), size=300_000)
    xs = np.arange(-80, 81)
    p = np.exp(-np.abs(xs) / scale)
    p /= p.sum()
    assert chi2_pvalue(x, xs, p) > 1e-3
    assert discrete_laplace_tv_bound(scale) < 1e-30


def test_secure_flag_and_rng_checks():
    assert discrete_gaussian(0, 2.0, secure=True, size=10).shape == (10,)
    assert isinstance(discrete_gaussian_exact(0.5, 2.0, secure=True), int)
    with pytest.raises(PrivacyError, match="secure=True"):
        discrete_gaussian(0, 2.0, np.random.default_rng(0), secure=True, size=3)
    with pytest.raises(PrivacyError, match="rng="):
        discrete_gaussian(0, 2.0, size=3)
    with pytest.raises(PrivacyError, match="sigma"):
        discrete_gaussian(0, -1.0, np.random.default_rng(0), size=3)
    with pytest.raises(PrivacyError):
        discrete_gaussian_exact(0.0, 0, np.random.default_rng(0))


def test_the_c_lookup_refuses_buffers_of_other_types_and_sizes():
    gk = S._kernel()
    if gk is None:
        pytest.skip("C kernel not built")
    t = S._gaussian_table(3.0)
    w, ri, rw = np.arange(10, dtype=np.uint32), np.empty(10, np.int64), np.empty(10, np.uint32)
    for out in (np.empty(10, np.float64), np.empty(10, np.uint64), np.empty(9, np.int64)):
        with pytest.raises(ValueError, match="dg_lookup: bad"):
            gk.dg_lookup(w, t.lut, t.thr, t.lo, t.hi, t.K, t.L, out, ri, rw, 0)
    with pytest.raises(ValueError, match="dg_lookup: bad"):
        gk.dg_lookup(w, t.lut, t.thr, t.lo, t.hi, t.K, t.L + 1, np.empty(10, np.int64), ri, rw, 0)  # table size
    with pytest.raises(ValueError, match="dg_lookup: bad"):
        gk.dg_lookup(w, t.lut, t.thr, t.lo, t.hi, 2**31, t.L, np.empty(10, np.int64), ri, rw, 0)
