"""DP histograms: noise moments against the closed forms, the stability threshold, validation."""

import math

import numpy as np
import pytest
from scipy import stats as st

from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.privacy.ledger import Ledger
from dpfl.stats import dp_histogram, stability_threshold, stable_histogram
from dpfl.stats.ledger import pure_epsilon


def _moments_match(noise: np.ndarray, var: float) -> None:
    """Mean 0 and variance `var`, within 5 standard errors estimated from the sample itself."""
    n = noise.size
    assert abs(noise.mean()) < 5 * math.sqrt(var / n)
    c2 = (noise - noise.mean()) ** 2
    assert abs(c2.mean() - var) < 5 * c2.std() / math.sqrt(n)


@pytest.mark.parametrize("neighbouring,delta1", [("add_remove", 1.0), ("replace_one", 2.0)])
def test_laplace_histogram_is_unbiased_with_the_closed_form_variance(neighbouring, delta1):
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 100, size=3000)
    edges = np.linspace(0, 100, 20_001)  # 20,000 bins: one noise draw each
    true, _ = np.histogram(values, bins=edges)
    eps = 0.7
    h = dp_histogram(values, eps, bins=edges, random_state=1, ledger=Ledger("rdp", neighbouring))
    _moments_match(h.counts - true, 2 * (delta1 / eps) ** 2)  # Var Lap(b) = 2 b^2, b = Δ1/ε
    assert pure_epsilon(h.ledger) == pytest.approx(eps)
    assert len(h.keys) == 20_000 and h.keys[0] == (0.0, 0.005)


def test_discrete_laplace_histogram_is_exact_integer_noise_with_the_closed_form_variance():
    cats = list(range(6000))
    values = np.array([3] * 40 + [7] * 5)
    eps = 0.5
    h = dp_histogram(values, eps, categories=cats, noise="discrete_laplace", random_state=2)
    assert h.counts.dtype.kind == "i"
    true = np.zeros(len(cats), dtype=np.int64)
    true[3], true[7] = 40, 5
    r = math.exp(-eps)  # pmf ∝ exp(-|x| ε / Δ1), Δ1 = 1
    _moments_match((h.counts - true).astype(float), 2 * r / (1 - r) ** 2)
    assert pure_epsilon(h.ledger) == pytest.approx(eps)


def test_known_domain_noises_every_bin_and_postprocessing_gives_nonnegative_integers():
    values = np.array(["a", "a", "b"])
    h = dp_histogram(values, 0.1, categories=["a", "b", "never"], postprocess=True, random_state=0)
    assert h.keys == ["a", "b", "never"]  # empty categories are released too (with noise)
    assert h.counts.dtype.kind == "i" and np.all(h.counts >= 0)
    again = dp_histogram(values, 0.1, categories=["a", "b", "never"], postprocess=True, random_state=0)
    assert np.array_equal(h.counts, again.counts)


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (0.1, 1e-6), (3.0, 0.01)])
def test_threshold_matches_an_independent_computation(eps, delta):
    b, tau = stability_threshold(eps, delta)
    assert b == pytest.approx(1 / eps)
    # a key held by one record is released with probability P[1 + Lap(1/ε) >= tau] = δ
    assert st.laplace.sf(tau - 1, scale=1 / eps) == pytest.approx(delta, rel=1e-9)
    # replace-one: run at (ε/2, δ') for add/remove, with (1 + e^(ε/2)) δ' = δ
    b2, tau2 = stability_threshold(eps, delta, "replace_one")
    assert b2 == pytest.approx(2 / eps)
    assert (1 + math.exp(eps / 2)) * st.laplace.sf(tau2 - 1, scale=2 / eps) == pytest.approx(delta, rel=1e-9)


def test_a_singleton_key_is_released_with_probability_delta():
    n, eps, delta = 20_000, 1.0, 0.2
    h = stable_histogram(np.arange(n), eps, delta, random_state=3)  # every key held by one record
    rate = len(h.keys) / n
    assert abs(rate - delta) < 5 * math.sqrt(delta * (1 - delta) / n)


def test_stable_histogram_never_releases_a_key_absent_from_the_data():
    values = np.array(["x"] * 30 + ["y"] * 2 + ["z"])
    seen = set()
    for seed in range(200):
        h = stable_histogram(values, 2.0, 0.4, random_state=seed)  # low tau: y and z often pass
        assert set(h.keys) <= {"x", "y", "z"}
        assert np.all(h.counts >= h.threshold)
        seen |= set(h.keys)
    assert seen == {"x", "y", "z"}
    big = stable_histogram(values, 1.0, 1e-6, random_state=0)
    assert big.keys == ["x"] and big.threshold == pytest.approx(1 + math.log(1 / 2e-6))
    assert big.ledger.events[0][0].epsilon == 1.0 and big.ledger.events[0][0].delta == 1e-6


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x"])
def test_epsilon_is_validated(bad):
    with pytest.raises(PrivacyError):
        dp_histogram([1.0], bad, bins=[0, 1])
    with pytest.raises(PrivacyError):
        stable_histogram([1.0], bad, 1e-5)


def test_bad_inputs_name_the_problem():
    with pytest.raises(PrivacyError, match="delta"):
        stable_histogram([1], 1.0, 0.0)
    with pytest.raises(ConfigError, match="exactly one"):
        dp_histogram([1.0], 1.0)
    with pytest.raises(ConfigError, match="increasing"):
        dp_histogram([1.0], 1.0, bins=[0, 0])
    with pytest.raises(ConfigError, match="noise"):
        dp_histogram([1.0], 1.0, bins=[0, 1], noise="gauss")
    with pytest.raises(DataError, match="NaN"):
        dp_histogram([1.0, float("nan")], 1.0, bins=[0, 1])
    with pytest.raises(DataError, match="numeric"):
        dp_histogram(["a"], 1.0, bins=[0, 1])


def test_bench_matches_the_closed_forms():
    import io

    from rich.console import Console

    from dpfl.bench.stats import run_bench

    (row,) = run_bench(epsilons=(0.5,), seeds=2, n=5000, console=Console(file=io.StringIO()))["rows"]
    se = 2.0 / math.sqrt(2 * 1000)  # sd of |Lap(b)| is b; 2 seeds x 1000 bins
    assert abs(row["laplace_abs_err"] - row["laplace_closed_form"]) < 5 * se
    assert abs(row["discrete_laplace_abs_err"] - row["discrete_laplace_closed_form"]) < 5 * se
    assert row["stable_tau"] == pytest.approx(1 + 2 * math.log(1 / 2e-6))
    assert 0 < row["keys_released"] and 0 < row["records_covered"] <= 1
