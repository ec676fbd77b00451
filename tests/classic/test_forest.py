"""DP random forest: split utilities vs scipy, their sensitivities by exhaustive enumeration,
learning vs scikit-learn's forest, ledger, determinism, errors."""

import itertools

import numpy as np
import pytest
from scipy.stats import entropy
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.ensemble import RandomForestClassifier
from sklearn.model_selection import train_test_split

from dpfl.classic.forest import DPRandomForest, gini_utility, infogain_utility, utility_sensitivity
from dpfl.errors import ConfigError, DataError
from dpfl.privacy.events import ComposedEvent, LaplaceEvent, PureDPEvent, SelfComposedEvent


def test_utilities_match_their_definitions():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 9, size=(20, 2, 3)).astype(float)
    for c, ig, gi in zip(counts, infogain_utility(counts), gini_utility(counts)):
        tot = c.sum(1)
        ref_ig = -sum(t * entropy(row, base=2) for t, row in zip(tot, c) if t > 0)
        ref_gi = -sum(t * (1 - ((row / t) ** 2).sum()) for t, row in zip(tot, c) if t > 0)
        assert ig == pytest.approx(ref_ig, abs=1e-9)
        assert gi == pytest.approx(ref_gi, abs=1e-9)


@pytest.mark.parametrize("criterion,fn", [("infogain", infogain_utility), ("gini", gini_utility)])
def test_utility_sensitivity_by_enumeration(criterion, fn):
    """Every 2-branch x 2-class table with <= N records; add, remove and replace one record."""
    N = 9
    tables = [np.array(t, float).reshape(2, 2) for t in itertools.product(range(N + 1), repeat=4) if sum(t) <= N]
    add_remove = utility_sensitivity(criterion, N) / 2
    worst_ar = worst_rep = 0.0
    for t in tables:
        u = fn(t[None])[0]
        for i, j in itertools.product(range(2), range(2)):
            if t.sum() < N:
                up = t.copy()
                up[i, j] += 1
                worst_ar = max(worst_ar, abs(fn(up[None])[0] - u))
            if t[i, j] > 0:
                for k, l in itertools.product(range(2), range(2)):
                    rep = t.copy()
                    rep[i, j] -= 1
                    rep[k, l] += 1
                    worst_rep = max(worst_rep, abs(fn(rep[None])[0] - u))
    assert worst_ar <= add_remove + 1e-12
    assert worst_rep <= utility_sensitivity(criterion, N) + 1e-12
    assert worst_ar > 0.5 * add_remove  # the bound is of the right size


def accuracy(eps, X, y, Xte, yte, b, seeds=4, **kw):
    return np.mean([(DPRandomForest(eps, bounds=b, random_state=s, **kw).fit(X, y).predict(Xte) == yte).mean()
                    for s in range(seeds)])


@pytest.mark.parametrize("loader", [load_breast_cancer, load_wine])
def test_learns_and_degrades(loader):
    X, y = loader(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0)
    b = (X.min(0), X.max(0))
    base = RandomForestClassifier(10, max_depth=4, random_state=0).fit(Xtr, ytr).score(Xte, yte)
    assert accuracy(1e4, Xtr, ytr, Xte, yte, b) > base - 0.08
    assert accuracy(0.05, Xtr, ytr, Xte, yte, b) < base - 0.25


def test_ledger_spends_epsilon():
    X, y = load_wine(return_X_y=True)
    b = (X.min(0), X.max(0))
    eps, T, D = 2.0, 5, 3
    for disjoint in (False, True):
        m = DPRandomForest(eps, bounds=b, n_trees=T, max_depth=D, disjoint=disjoint, random_state=0).fit(X, y)
        (event, count), = m.ledger_.events
        assert isinstance(event, ComposedEvent) and count == (1 if disjoint else T)
        levels, leaves = event.events
        assert isinstance(levels, SelfComposedEvent) and levels.count == D
        assert isinstance(levels.event, PureDPEvent) and isinstance(leaves, LaplaceEvent)
        spent = count * (D * levels.event.epsilon + 2 / leaves.scale)  # replace-one Laplace: ε = 2/scale
        assert spent == pytest.approx(eps, rel=1e-12)
        assert m.ledger_.epsilon(1e-6) <= eps + 0.05


def test_determinism_and_errors():
    X, y = load_wine(return_X_y=True)
    b = (X.min(0), X.max(0))
    p1 = DPRandomForest(1.0, bounds=b, random_state=7).fit(X, y).predict_proba(X)
    assert np.array_equal(p1, DPRandomForest(1.0, bounds=b, random_state=7).fit(X, y).predict_proba(X))
    np.testing.assert_allclose(p1.sum(1), 1.0)
    with pytest.raises(ConfigError, match="criterion"):
        DPRandomForest(1.0, bounds=b, criterion="gainratio")
    with pytest.raises(ConfigError, match="max_depth"):
        DPRandomForest(1.0, bounds=b, max_depth=-1)
    with pytest.raises(DataError, match="outside classes"):
        DPRandomForest(1.0, bounds=b, classes=[0, 1]).fit(X, y)
    with pytest.raises(DataError, match="features"):
        DPRandomForest(1.0, bounds=b).fit(X, y).predict(X[:, :3])
