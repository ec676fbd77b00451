"""DP SVM: SMO vs scikit-learn's hinge-loss solver, the sensitivity bound by replacing records,
learning vs a non-private baseline, ledger, determinism, errors."""

import math

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split
from sklearn.svm import LinearSVC

from dpfl.classic.svm import DPSVM, smo_dual
from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.privacy.events import LaplaceEvent
from dpfl.stats.inputs import to_unit_ball


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0)
    return Xtr, Xte, ytr, yte, (X.min(0), X.max(0))


def test_smo_matches_liblinear_hinge_svm(cancer):
    Xtr, _, ytr, _, b = cancer
    Z = to_unit_ball(Xtr, b, True)
    s = np.where(ytr == 1, 1.0, -1.0)
    C = 1.0
    a, gap, _ = smo_dual(Z, s, C, 1e-10, 10**6)
    w = Z.T @ (a * s)
    assert gap <= 1e-10 and np.all((a >= 0) & (a <= C))
    ref = LinearSVC(C=C, loss="hinge", fit_intercept=False, tol=1e-10, max_iter=10**6).fit(Z, ytr).coef_[0]
    # both solve the same strongly convex primal: their optima agree
    assert np.linalg.norm(w - ref) <= 1e-3 * np.linalg.norm(ref)


def test_replacing_one_record_moves_w_by_at_most_2C():
    rng = np.random.default_rng(0)
    n, d, C = 40, 3, 2.0
    Z = rng.normal(size=(n, d))
    Z /= np.maximum(1, np.linalg.norm(Z, axis=1, keepdims=True))
    s = np.sign(Z[:, 0] + 0.3 * rng.normal(size=n))
    w0 = Z.T @ (smo_dual(Z, s, C, 1e-12, 10**6)[0] * s)
    worst = 0.0
    for trial in range(60):
        Z2, s2 = Z.copy(), s.copy()
        i = trial % n
        v = rng.normal(size=d)
        Z2[i] = v / np.linalg.norm(v)  # an extreme replacement on the unit sphere
        s2[i] = -s[i]
        w1 = Z2.T @ (smo_dual(Z2, s2, C, 1e-12, 10**6)[0] * s2)
        worst = max(worst, np.linalg.norm(w1 - w0))
    assert worst <= 2 * C
    assert worst > 0.05 * 2 * C  # the bound is not vacuous for this data


def test_learns_and_degrades(cancer):
    Xtr, Xte, ytr, yte, b = cancer
    base = (DPSVM(1e9, bounds=b, random_state=0).fit(Xtr, ytr).predict(Xte) == yte).mean()
    assert base > 0.9

    def acc(eps):
        return np.mean([(DPSVM(eps, bounds=b, random_state=s).fit(Xtr, ytr).predict(Xte) == yte).mean()
                        for s in range(8)])

    assert acc(300.0) > base - 0.03
    assert acc(0.3) < base - 0.15


def test_ledger_and_noise_scale(cancer):
    Xtr, _, ytr, _, b = cancer
    eps, C = 2.0, 0.5
    m = DPSVM(eps, C=C, bounds=b, random_state=0).fit(Xtr, ytr)
    (event, count), = m.ledger_.events
    assert isinstance(event, LaplaceEvent) and count == 1 and event.scale == pytest.approx(2 / eps)
    d = Xtr.shape[1] + 1
    assert m.sensitivity_ == pytest.approx(math.sqrt(d) * 2 * C * (1 + m.gap_tol))
    assert m.duality_gap_ <= (m.gap_tol * C) ** 2 / 2
    # the released noise has the Laplace scale Δ/ε: E|noise| = scale, over coordinates and seeds
    w = DPSVM(1e12, C=C, bounds=b, random_state=0).fit(Xtr, ytr).coef_
    noise = np.concatenate([DPSVM(eps, C=C, bounds=b, random_state=s).fit(Xtr, ytr).coef_ - w for s in range(40)])
    assert np.mean(np.abs(noise)) == pytest.approx(m.sensitivity_ / eps, rel=0.1)


def test_determinism_and_errors(cancer):
    Xtr, _, ytr, _, b = cancer
    a = DPSVM(1.0, bounds=b, random_state=3).fit(Xtr, ytr).coef_
    assert np.array_equal(a, DPSVM(1.0, bounds=b, random_state=3).fit(Xtr, ytr).coef_)
    with pytest.raises(PrivacyError, match="duality gap"):
        DPSVM(1.0, bounds=b, max_iter=5).fit(Xtr, ytr)
    with pytest.raises(ConfigError, match="C must"):
        DPSVM(1.0, C=0)
    with pytest.raises(DataError, match="two classes"):
        DPSVM(1.0, bounds=b).fit(Xtr, np.arange(len(ytr)) % 3)
