"""DP mean / std across clients: noiseless limit, noise of the stated scale, ledger, errors."""

import math

import numpy as np
import pytest

from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.privacy.events import LaplaceEvent
from dpfl.stats import dp_mean_std


def clients(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal([1.0, -2.0, 5.0], [0.5, 1.0, 2.0], size=(n, 3)) for n in (300, 500, 200)]


def test_noiseless_limit_is_the_pooled_clipped_mean_and_std():
    cs = clients()
    lo, hi = np.array([-1.0, -6.0, 0.0]), np.array([3.0, 2.0, 9.0])
    st = dp_mean_std(cs, 1e12, (lo, hi), random_state=0)
    pooled = np.clip(np.vstack(cs), lo, hi)
    np.testing.assert_allclose(st.mean, pooled.mean(0), atol=1e-8)
    np.testing.assert_allclose(st.std, pooled.std(0), atol=1e-6)
    assert st.n == 1000


def test_mean_noise_has_the_laplace_scale_and_ledger_spends_epsilon():
    cs = clients(1)
    lo, hi = -4.0, 8.0
    eps, n, d = 1.0, 1000, 3
    exact = dp_mean_std(cs, 1e12, (lo, hi), random_state=0).mean
    errs = np.array([dp_mean_std(cs, eps, (lo, hi), random_state=s).mean - exact for s in range(300)])
    # sum of u in [0,1]^d has L1 sensitivity d; half of ε: mean error ~ (hi-lo) Lap(d/(ε/2))/n
    b = (hi - lo) * d / (eps / 2) / n
    assert np.mean(np.abs(errs)) == pytest.approx(b, rel=0.1)
    led = dp_mean_std(cs, eps, (lo, hi), random_state=0).ledger
    spent = [2 / e.scale * c for e, c in led.events]
    assert all(isinstance(e, LaplaceEvent) for e, _ in led.events)
    assert sum(spent) == pytest.approx(eps) and spent[0] == pytest.approx(eps / 2)


def test_errors():
    cs = clients()
    with pytest.raises(PrivacyError):
        dp_mean_std(cs, -1.0, (0, 1))
    with pytest.raises(ConfigError, match="lo < hi"):
        dp_mean_std(cs, 1.0, (1, 0))
    with pytest.raises(DataError, match="3 features"):
        dp_mean_std([cs[0], cs[1][:, :2]], 1.0, (0, 1))
    with pytest.raises(ConfigError, match="mean_fraction"):
        dp_mean_std(cs, 1.0, (0, 1), mean_fraction=1.0)
    assert math.isfinite(dp_mean_std(cs, 1.0, (0, 1), random_state=0).std.sum())
