"""Noise shares: the sum of k clients' shares has exactly the target law (KS against scipy)."""

import numpy as np
import pytest
from scipy import stats

from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds
from dpfl.stats.noisy_sum import gaussian_share, laplace_share, noisy_sum


@pytest.mark.parametrize("k", [1, 2, 7])
def test_laplace_shares_sum_to_laplace(k):
    seeds = Seeds(k)
    total = sum(laplace_share(k, 1.5, 4000, seeds.crypto("c", i)) for i in range(k))
    assert stats.kstest(total, stats.laplace(scale=1.5).cdf).pvalue > 1e-3
    if k > 1:  # one share alone is far from Laplace(1.5) (its variance is 2 b^2 / k)
        one = laplace_share(k, 1.5, 4000, seeds.crypto("alone"))
        assert np.var(one) == pytest.approx(2 * 1.5**2 / k, rel=0.15)


@pytest.mark.parametrize("k", [1, 5])
def test_gaussian_shares_sum_to_gaussian(k):
    seeds = Seeds(10 + k)
    total = sum(gaussian_share(k, 2.0, 4000, seeds.crypto("c", i)) for i in range(k))
    assert stats.kstest(total, stats.norm(scale=2.0).cdf).pvalue > 1e-3


def test_noisy_sum_uses_the_summer_and_per_coordinate_scales():
    seeds = Seeds(0)
    rows = np.arange(12.0).reshape(3, 4)
    seen = []

    def summer(r):
        seen.append(r.copy())
        return r.sum(0)

    scale = np.array([1e-9, 1e-9, 5.0, 5.0])
    out = noisy_sum(rows, [seeds.crypto(i) for i in range(3)], laplace_scale=scale, summer=summer)
    assert len(seen) == 1 and seen[0].shape == (3, 4)
    assert not np.allclose(seen[0], rows)  # each client's row carries its share before summing
    np.testing.assert_allclose(out[:2], rows.sum(0)[:2], atol=1e-6)
    again = noisy_sum(rows, [seeds.crypto(i) for i in range(3)], laplace_scale=scale)
    assert np.array_equal(out, again)


def test_errors():
    rngs = [Seeds(0).crypto(i) for i in range(2)]
    with pytest.raises(ConfigError, match="exactly one"):
        noisy_sum(np.ones((2, 3)), rngs)
    with pytest.raises(ConfigError, match="one noise source per client"):
        noisy_sum(np.ones((3, 3)), rngs, laplace_scale=1.0)
    with pytest.raises(DataError, match="n_clients, m"):
        noisy_sum(np.ones(3), rngs, laplace_scale=1.0)
