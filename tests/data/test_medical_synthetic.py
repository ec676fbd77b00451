"""The synthetic medical dataset: thesis shape, hospitals, calibration, learnability, determinism."""

import numpy as np
import pytest
import torch
from scipy.special import expit
from scipy.stats import binom

from dpfl.data import load_dataset
from dpfl.data.medical import (
    ADMISSION,
    AGE,
    CODES,
    GENDER,
    MRCI,
    N_FEATURES,
    POSITIVE_RATE,
    _world,
    assign_hospitals,
    medical_sizes,
)
from dpfl.errors import ConfigError
from dpfl.rng import Seeds


@pytest.fixture(scope="module")
def small():
    return load_dataset("medical-synthetic", seed=7, n_hospitals=30, n_test=3000)  # 6,243 train patients


def test_full_scale_layout_matches_thesis():
    sizes, n_test = medical_sizes(scale=1.0)
    assert len(sizes) == 5011 and (sizes[:-1] == 203).all() and sizes[-1] == 356
    assert sizes.sum() == 1_017_386 and n_test == 254_347  # Table 8.7
    assert POSITIVE_RATE == pytest.approx(0.0316, abs=5e-5)
    assert N_FEATURES == 7280 and CODES.stop - CODES.start == 7271
    sizes, _ = medical_sizes(scale=0.01)
    assert len(sizes) == 50


def test_shapes_and_columns(small):
    x, y = small.x_train, small.y_train
    assert x.shape == (6243, 7280) and small.x_test.shape == (3000, 7280) and x.dtype == torch.float32
    assert small.task == "binary" and small.num_classes == 2 and y.dtype == torch.int64
    assert torch.all(x[:, GENDER].sum(1) == 1) and torch.all(x[:, ADMISSION].sum(1) == 1)
    codes = x[:, CODES]
    assert torch.all((codes == 0) | (codes == 1))
    for col in (AGE, MRCI):
        v = x[:, col]
        assert float(v.min()) >= 0 and float(v.max()) <= 1
        assert torch.all(v * 1024 == torch.round(v * 1024))  # exact in float16
    n_codes = codes.sum(1)
    assert n_codes.min() >= 1 and 10 < float(n_codes.mean()) < 40
    # heavy-tailed code frequencies: the commonest code is far more frequent than the median one
    prev = codes.mean(0)
    assert float(prev.max()) > 50 * float(prev.median())


def test_hospitals(small):
    h = small.client_indices
    assert [len(c) for c in h] == [203] * 29 + [356]
    allidx = np.concatenate(h)
    assert np.array_equal(np.sort(allidx), np.arange(small.n_train))
    y = small.y_train.numpy()
    assert all(y[c].sum() >= 1 for c in h)
    xp, yp = small.public
    assert torch.equal(xp, small.x_train[h[-1]]) and torch.equal(yp, small.y_train[h[-1]])


def test_positive_rate(small):
    # the intercept is calibrated: expected rate on a fresh sample is 3.16 % (MC error ~ 1e-4)
    world, b = _world(7, POSITIVE_RATE)
    z = world.patients(40_000, Seeds(99).numpy("fresh"))["z"]
    assert expit(z + b).mean() == pytest.approx(POSITIVE_RATE, abs=1e-3)
    # the realised counts are binomial around it (two-sided 1e-4 tails)
    for y in (small.y_train, small.y_test):
        lo, hi = binom.ppf([1e-4, 1 - 1e-4], len(y), POSITIVE_RATE)
        assert lo <= int(y.sum()) <= hi


def test_learnable_but_not_trivial(small):
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    clf = LogisticRegression(C=0.05, max_iter=300, class_weight="balanced", solver="liblinear")
    clf.fit(csr_matrix(small.x_train.numpy()), small.y_train.numpy())
    auc = roc_auc_score(small.y_test.numpy(), clf.decision_function(csr_matrix(small.x_test.numpy())))
    assert 0.62 < auc < 0.95


def test_deterministic_and_float16_exact():
    kw = {"n_hospitals": 3, "n_test": 100}
    a = load_dataset("medical-synthetic", seed=7, **kw)
    b = load_dataset("medical-synthetic", seed=7, dtype="float16", **kw)
    assert b.x_train.dtype == torch.float16
    assert torch.equal(b.x_train.float(), a.x_train) and torch.equal(b.y_test, a.y_test)
    assert all(np.array_equal(u, v) for u, v in zip(a.client_indices, b.client_indices))
    other = load_dataset("medical-synthetic", seed=8, **kw)
    assert not torch.equal(other.x_train, a.x_train)


def test_assign_hospitals_brute_force():
    rng = np.random.default_rng(0)
    y = np.zeros(40, dtype=np.int64)
    y[[3, 9, 17, 30, 31]] = 1
    sizes = np.array([8, 8, 8, 16])
    for s in range(20):
        h = assign_hospitals(y, sizes, np.random.default_rng(s))
        assert [len(c) for c in h] == [8, 8, 8, 16]
        assert sorted(np.concatenate(h).tolist()) == list(range(40))
        assert all(y[c].sum() >= 1 for c in h)
    with pytest.raises(ConfigError, match="only 5 positive patients for 6 hospitals"):
        assign_hospitals(y, np.array([5, 5, 5, 5, 5, 15]), rng)


def test_option_errors():
    with pytest.raises(ConfigError, match=r"scale must be in \(0, 1\], got 2"):
        load_dataset("medical-synthetic", scale=2)
    with pytest.raises(ConfigError, match="n_hospitals must be an integer >= 2"):
        load_dataset("medical-synthetic", n_hospitals=1)
    with pytest.raises(ConfigError, match="dtype must be 'auto', 'float32' or 'float16', got 'uint8'"):
        load_dataset("medical-synthetic", scale=0.001, dtype="uint8")
    with pytest.raises(
        ConfigError, match="natural hospital partition; reduce it with scale= or n_hospitals="
    ):
        load_dataset("medical-synthetic", n_train=500)
