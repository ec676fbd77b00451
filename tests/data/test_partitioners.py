"""Partitioners and majority-class down-sampling: coverage, sizes, reproducibility, statistics."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.data import downsample_majority, partition
from dpfl.data.partition import largest_remainder
from dpfl.errors import ConfigError, DataError

LABELS = np.repeat(np.arange(10), 600)  # 6,000 samples, 10 balanced classes


def assert_disjoint(parts, n=None):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx)
    if n is not None:
        assert np.array_equal(np.sort(allidx), np.arange(n))
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize(
    "method,kw",
    [
        ("shards", {}),
        ("dirichlet", {"alpha": 0.3}),
        ("classes", {"classes_per_client": 2}),
        ("quantity", {"sigma": 1.0}),
    ],
)
def test_reproducible_and_seed_dependent(method, kw):
    a = partition(LABELS, 30, method, seed=1, **kw)
    b = partition(torch.from_numpy(LABELS), 30, method, seed=1, **kw)
    c = partition(LABELS, 30, method, seed=2, **kw)
    assert len(a) == 30 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert_disjoint(a, None if method == "shards" else len(LABELS))
    assert not all(np.all(np.diff(p) > 0) for p in a)  # a random order, not sorted


def test_shards_equal_random():
    parts = partition(LABELS, 600, "shards")  # thesis: |D_k| = 6000 / 600 = 10
    assert [len(p) for p in parts] == [10] * 600
    assert_disjoint(parts, 6000)
    parts = partition(LABELS, 100, "shards", size=10)
    assert [len(p) for p in parts] == [10] * 100
    assert_disjoint(parts)
    # IID: label counts of the 1,000 taken samples are multivariate hypergeometric; chi-square vs uniform
    counts = np.bincount(LABELS[np.concatenate(parts)], minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-4
    with pytest.raises(ConfigError, match=r"shards size must be an integer in 1..60 for 100 clients"):
        partition(LABELS, 100, "shards", size=61)


def test_dirichlet_matches_beta_moments():
    # share of one class given to one client ~ Beta(alpha, (n-1) alpha):
    # mean 1/n, variance (1/n)(1-1/n)/(n alpha+1)
    n, alpha = 5, 0.5
    y = np.repeat(np.arange(2), 4000)
    shares = []
    for s in range(200):
        parts = partition(y, n, "dirichlet", seed=s, alpha=alpha, min_size=0)
        shares.append([np.sum(y[p] == 0) / 4000 for p in parts])
    shares = np.array(shares)
    mean, var = 1 / n, (1 / n) * (1 - 1 / n) / (n * alpha + 1)
    assert shares.mean() == pytest.approx(mean, abs=0.01)
    assert shares.var() == pytest.approx(var, rel=0.15)
    # KS test of client 0's share against Beta(alpha, (n-1) alpha)
    assert stats.kstest(shares[:, 0], stats.beta(alpha, (n - 1) * alpha).cdf).pvalue > 1e-3


def test_dirichlet_skew_grows_as_alpha_falls():
    def mean_tv(alpha):
        parts = partition(LABELS, 20, "dirichlet", seed=0, alpha=alpha)
        return np.mean(
            [0.5 * np.abs(np.bincount(LABELS[p], minlength=10) / len(p) - 0.1).sum() for p in parts]
        )

    assert mean_tv(100.0) < 0.1 < mean_tv(0.1)
    parts = partition(LABELS, 20, "dirichlet", seed=0, alpha=0.05, min_size=20)
    assert min(len(p) for p in parts) >= 20
    with pytest.raises(ConfigError, match="dirichlet alpha must be > 0"):
        partition(LABELS, 20, "dirichlet", alpha=0)


def test_classes_per_client():
    for k in (1, 2, 3):
        parts = partition(LABELS, 40, "classes", seed=k, classes_per_client=k)
        assert all(len(np.unique(LABELS[p])) == k for p in parts)
        assert_disjoint(parts, len(LABELS))
        assert {len(p) for p in parts} == {150}  # 4k holders per class, 600 / (4k) samples from each of k
    with pytest.raises(ConfigError, match=r"classes_per_client must be an integer in 1..10, got 11"):
        partition(LABELS, 40, "classes", classes_per_client=11)


def test_quantity_skew():
    parts = partition(LABELS, 50, "quantity", sigma=0.0)
    assert {len(p) for p in parts} == {120}
    sizes = np.array([len(p) for p in partition(np.zeros(200_000, np.int64), 4000, "quantity", sigma=0.8)])
    assert sizes.sum() == 200_000 and sizes.min() >= 1
    # sizes follow the log-normal weights: coefficient of variation sqrt(exp(sigma^2) - 1)
    assert sizes.std() / sizes.mean() == pytest.approx(np.sqrt(np.exp(0.8**2) - 1), rel=0.1)
    with pytest.raises(ConfigError, match="quantity sigma must be >= 0"):
        partition(LABELS, 50, "quantity", sigma=-1)


def test_largest_remainder_is_hamilton_rounding():
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.random(7)
        total = int(rng.integers(0, 100))
        out = largest_remainder(w, total)
        assert out.sum() == total
        quota = [Fraction(float(x)) / Fraction(float(w.sum())) * total for x in w]  # exact quotas
        assert all(int(q) <= o <= int(q) + 1 for q, o in zip(quota, out))


def test_partition_errors():
    with pytest.raises(
        ConfigError, match="unknown partition method 'iid'; allowed: shards, dirichlet, classes, quantity"
    ):
        partition(LABELS, 10, "iid")
    with pytest.raises(ConfigError, match=r"unknown options \['beta'\]; allowed: alpha, min_size, max_tries"):
        partition(LABELS, 10, "dirichlet", beta=1)
    with pytest.raises(ConfigError, match=r"n_clients must be an integer in 1..6000"):
        partition(LABELS, 0)
    with pytest.raises(DataError, match="labels must be a 1-D integer array"):
        partition(np.zeros((3, 2), np.int64), 1)


def test_downsample_majority_public_hospital():
    # the thesis's public hospital: 356 patients, 12 positives -> 24 (12 per class)
    y = np.zeros(1000, dtype=np.int64)
    idx = np.random.default_rng(0).permutation(1000)[:356]
    y[idx[:12]] = 1
    out = downsample_majority(idx, y, np.random.default_rng(1))
    assert len(out) == 24 and y[out].sum() == 12
    assert set(idx[:12]) <= set(out) and set(out) <= set(idx)
    pos = {v: i for i, v in enumerate(idx)}
    assert [pos[v] for v in out] == sorted(pos[v] for v in out)  # order kept
    again = downsample_majority(idx, y, np.random.default_rng(1))
    assert np.array_equal(out, again)


def test_downsample_majority_is_uniform():
    # each of the 9 negatives is kept with probability 3/9
    y = np.array([1, 1, 1] + [0] * 9)
    rng = np.random.default_rng(5)
    hits = np.zeros(12)
    for _ in range(1500):
        hits[downsample_majority(np.arange(12), y, rng)] += 1
    assert np.all(hits[:3] == 1500)
    assert stats.chisquare(hits[3:]).pvalue > 1e-4 and hits[3:].sum() == 4500


def test_downsample_single_class_error():
    with pytest.raises(DataError, match=r"all have label \[0\]"):
        downsample_majority(np.arange(5), np.zeros(5, np.int64), np.random.default_rng(0))
