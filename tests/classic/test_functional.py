"""Functional-mechanism regression: sensitivity by brute force, noiseless limit vs scipy/sklearn,
learning vs a non-private baseline, ledger contents, federation, determinism, errors."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from scipy import optimize
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from dpfl.classic.functional import (
    FunctionalLinearRegression,
    FunctionalLogisticRegression,
    monomial_sums,
    monomials,
    quad_group_bound,
    quadratic_from_monomials,
)
from dpfl.errors import DataError, DpflError, PrivacyError
from dpfl.privacy.events import LaplaceEvent
from dpfl.privacy.ledger import Ledger
from dpfl.privacy.rdp import DEFAULT_ORDERS
from dpfl.stats.inputs import to_unit_ball


def record_l1(z, t, lin, quad, cols=None, pairs=None):
    """L1 norm of one record's objective coefficients (optionally a group of them)."""
    c_lin = np.abs(lin * t * z)
    c_quad = np.abs(quad * monomials(z[None, :])[0])
    if cols is not None:
        c_lin, c_quad = c_lin[cols], c_quad[pairs]
    return c_lin.sum() + c_quad.sum()


@pytest.mark.parametrize("cls", [FunctionalLinearRegression, FunctionalLogisticRegression])
def test_sensitivity_bound_holds_and_is_attained(cls):
    rng = np.random.default_rng(0)
    d = 7
    half = abs(cls.lin) * cls.t_max * math.sqrt(d) + cls.quad * d  # Δ / 2
    z = rng.normal(size=(3000, d))
    z /= np.maximum(1, np.linalg.norm(z, axis=1, keepdims=True)) * rng.uniform(1, 3, size=(3000, 1))
    worst = max(record_l1(zi, cls.t_max, cls.lin, cls.quad) for zi in z)
    assert worst <= half + 1e-12
    corner = np.ones(d) / math.sqrt(d)  # |z_j| all equal on the sphere: ||z||_1 = sqrt(d)
    assert record_l1(corner, cls.t_max, cls.lin, cls.quad) == pytest.approx(half, rel=1e-12)
    X = np.vstack([corner, -corner])
    y = np.array([1.0, -1.0]) if cls is FunctionalLinearRegression else np.array([0, 1])
    m = cls(1.0, fit_intercept=False, random_state=0).fit(X, y)
    assert m.sensitivity_ == pytest.approx(2 * half)


def test_relevance_group_bounds_by_brute_force():
    rng = np.random.default_rng(1)
    d, s = 6, 2
    strong = np.zeros(d, bool)
    strong[:s] = True
    iu = np.triu_indices(d)
    touch = strong[iu[0]] | strong[iu[1]]
    bound_quad = quad_group_bound(s, d - s)
    z = rng.normal(size=(5000, d))
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    masses = np.abs(monomials(z))[:, touch].sum(1)
    assert masses.max() <= bound_quad + 1e-12
    # the bound is attained at the top eigenvector of [[s, sqrt(sw)], [sqrt(sw), 0]]
    w = d - s
    _, V = np.linalg.eigh(np.array([[s, math.sqrt(s * w)], [math.sqrt(s * w), 0.0]]))
    p, q = np.abs(V[:, -1])
    zstar = np.concatenate([np.full(s, p / math.sqrt(s)), np.full(w, q / math.sqrt(w))])
    assert np.abs(monomials(zstar[None])[0])[touch].sum() == pytest.approx(bound_quad, rel=1e-12)


def test_monomials_round_trip():
    rng = np.random.default_rng(2)
    z = rng.normal(size=(5, 4))
    np.testing.assert_allclose(monomial_sums(z), monomials(z).sum(0), rtol=1e-12)
    Q = quadratic_from_monomials(monomials(z).sum(0), 4)
    np.testing.assert_allclose(Q, z.T @ z, rtol=1e-12)


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0)
    return Xtr, Xte, ytr, yte, (X.min(0), X.max(0)), (y.min(), y.max())


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0)
    return Xtr, Xte, ytr, yte, (X.min(0), X.max(0))


def test_linear_noiseless_limit_is_least_squares(diabetes):
    Xtr, _, ytr, _, b, yb = diabetes
    m = FunctionalLinearRegression(1e12, bounds=b, y_bounds=yb, random_state=0).fit(Xtr, ytr)
    Z = to_unit_ball(Xtr, b, True)
    t = 2 * (ytr - yb[0]) / (yb[1] - yb[0]) - 1
    ref = LinearRegression(fit_intercept=False).fit(Z, t).coef_
    np.testing.assert_allclose(m.coef_, ref, rtol=1e-5, atol=1e-6)


def test_logistic_noiseless_limit_minimises_the_taylor_objective(cancer):
    Xtr, _, ytr, _, b = cancer
    m = FunctionalLogisticRegression(1e12, bounds=b, random_state=0).fit(Xtr, ytr)
    Z = to_unit_ball(Xtr, b, True)

    def taylor(w):  # sum_i log 2 + z^T w / 2 + (z^T w)^2 / 8 - y z^T w
        s = Z @ w
        return np.sum(math.log(2) + s / 2 + s**2 / 8 - ytr * s)

    ref = optimize.minimize(taylor, np.zeros(Z.shape[1]), method="BFGS", options={"gtol": 1e-10}).x
    assert taylor(m.coef_) <= taylor(ref) + 1e-9 * abs(taylor(ref))
    np.testing.assert_allclose(m.coef_, ref, rtol=0.05, atol=0.01)


def test_linear_learns_and_degrades(diabetes):
    Xtr, Xte, ytr, yte, b, yb = diabetes
    base = np.mean((LinearRegression().fit(Xtr, ytr).predict(Xte) - yte) ** 2)

    def mse(eps, split):
        return np.mean([np.mean((FunctionalLinearRegression(eps, bounds=b, y_bounds=yb, budget_split=split,
                                                            random_state=s).fit(Xtr, ytr).predict(Xte) - yte) ** 2)
                        for s in range(8)])

    for split in ("uniform", "relevance"):
        assert mse(1000.0, split) < 1.05 * base
        assert mse(0.1, split) > 1.5 * base


def test_logistic_learns_and_degrades(cancer):
    Xtr, Xte, ytr, yte, b = cancer
    base = make_pipeline(StandardScaler(), LogisticRegression()).fit(Xtr, ytr).score(Xte, yte)

    def acc(eps):
        return np.mean([(FunctionalLogisticRegression(eps, bounds=b, random_state=s).fit(Xtr, ytr).predict(Xte) == yte)
                        .mean() for s in range(8)])

    assert acc(1000.0) > base - 0.05
    assert acc(0.3) < base - 0.2


def test_ledger_records_exactly_epsilon(cancer):
    Xtr, _, ytr, _, b = cancer
    eps = 0.7
    m = FunctionalLogisticRegression(eps, bounds=b, random_state=0).fit(Xtr, ytr)
    (event, count), = m.ledger_.events
    assert isinstance(event, LaplaceEvent) and count == 1
    # replace-one: noise scale Δ/ε with Δ = 2C, i.e. event scale (Δ/ε)/C = 2/ε
    assert event.scale == pytest.approx(2 / eps, rel=1e-12)
    ref = rdp.RdpAccountant(list(DEFAULT_ORDERS))
    ref.compose(dp_event.LaplaceDpEvent(1 / eps))  # an independent RDP curve of an ε-DP Laplace
    assert m.ledger_.epsilon(1e-6) == pytest.approx(ref.get_epsilon(1e-6), rel=1e-6)
    assert eps <= m.ledger_.epsilon(1e-6) <= eps + math.log(1e6) / 1000


def test_relevance_split_spends_epsilon_in_three_releases(diabetes):
    Xtr, _, ytr, _, b, yb = diabetes
    eps = 2.0
    m = FunctionalLinearRegression(eps, bounds=b, y_bounds=yb, budget_split="relevance", random_state=3).fit(Xtr, ytr)
    spent = [2 / e.scale * c for e, c in m.ledger_.events]  # replace-one Laplace: ε = 2 / scale
    assert len(spent) == 3
    assert sum(spent) == pytest.approx(eps, rel=1e-12)
    assert spent[0] == pytest.approx(m.relevance_fraction * eps)
    assert m.strong_features_.sum() == math.ceil(0.5 * (Xtr.shape[1] + 1))


def test_shared_ledger_budget_refuses_second_fit(cancer):
    Xtr, _, ytr, _, b = cancer
    from dpfl.privacy.ledger import Budget

    led = Ledger("rdp", "replace_one", Budget(1.5, 1e-6))
    FunctionalLogisticRegression(1.0, bounds=b, ledger=led, random_state=0).fit(Xtr, ytr)
    with pytest.raises(PrivacyError):
        FunctionalLogisticRegression(1.0, bounds=b, ledger=led, random_state=1).fit(Xtr, ytr)
    with pytest.raises(PrivacyError, match="replace_one"):
        FunctionalLogisticRegression(1.0, bounds=b, ledger=Ledger("rdp"), random_state=0).fit(Xtr, ytr)


def test_federated_matches_pooled_and_is_reproducible(diabetes):
    Xtr, _, ytr, _, b, yb = diabetes
    parts = np.array_split(np.arange(len(ytr)), 3)
    clients = [(Xtr[p], ytr[p]) for p in parts]
    calls = []

    def summer(rows):
        calls.append(rows.shape)
        return rows.sum(0)

    fed = FunctionalLinearRegression(1e12, bounds=b, y_bounds=yb, random_state=0).fit_federated(clients, summer)
    pooled = FunctionalLinearRegression(1e12, bounds=b, y_bounds=yb, random_state=0).fit(Xtr, ytr)
    np.testing.assert_allclose(fed.coef_, pooled.coef_, rtol=1e-6, atol=1e-8)
    assert calls and all(c[0] == 3 for c in calls)
    a = FunctionalLinearRegression(1.0, bounds=b, y_bounds=yb, random_state=5).fit_federated(clients)
    c = FunctionalLinearRegression(1.0, bounds=b, y_bounds=yb, random_state=5).fit_federated(clients)
    assert np.array_equal(a.coef_, c.coef_)
    assert not np.array_equal(a.coef_, FunctionalLinearRegression(1.0, bounds=b, y_bounds=yb, random_state=6)
                              .fit_federated(clients).coef_)


def test_bad_input_raises_clear_errors(cancer):
    Xtr, _, ytr, _, b = cancer
    with pytest.raises(PrivacyError, match="epsilon"):
        FunctionalLogisticRegression(0.0)
    with pytest.raises(DpflError, match="budget_split"):
        FunctionalLogisticRegression(1.0, budget_split="magic")
    with pytest.raises(DataError, match="norm <= 1"):
        FunctionalLogisticRegression(1.0).fit(Xtr, ytr)
    with pytest.raises(DataError, match="two classes"):
        FunctionalLogisticRegression(1.0, bounds=b).fit(Xtr, np.arange(len(ytr)) % 3)
    with pytest.raises(DataError, match=r"\[-1, 1\]"):
        FunctionalLinearRegression(1.0, bounds=b).fit(Xtr, ytr * 5.0)
    with pytest.raises(DpflError, match="bounds"):
        FunctionalLinearRegression(1.0, bounds=(1.0, 0.0)).fit(Xtr, ytr)
