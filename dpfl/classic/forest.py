"""ε-DP random forest (after Hou et al. 2019, DPRF): exponential-mechanism splits, Laplace leaf counts.

Every tree is a complete binary tree of depth `max_depth` (its shape never depends on the data).
At each internal node the split (feature, threshold) is chosen by the exponential mechanism
among a random subset of features (`max_features`) and `n_thresholds` thresholds spaced evenly
inside each feature's public range. The utility is the information gain (count-weighted, as in
Friedman & Schuster 2010) or the Gini score. Leaves release their class counts with Laplace
noise; a tree votes with its noisy class frequencies.

Budget (replace-one adjacency, n public):
- nodes of one depth hold disjoint records, so a whole level costs one selection (parallel
  composition); a replaced record touches at most two nodes of a level, each calibrated
  with the replace-one utility sensitivity;
- the leaf count histogram has L1 sensitivity 2;
- a tree spends leaf_fraction * ε_tree on leaves and the rest evenly over its levels;
- `disjoint=True` gives each tree its own part of a random partition of the records, so the
  trees compose in parallel (ε_tree = ε); otherwise they share the data (ε_tree = ε / n_trees).

Deviation: Hou et al. score splits by a linear mix of InfoGain and GainRatio; GainRatio has no
bounded sensitivity (its denominator, the split information, can approach 0), so only
bounded-sensitivity scores are offered.
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import ConfigError, DataError
from dpfl.privacy.events import ComposedEvent, SelfComposedEvent
from dpfl.privacy.mechanisms import exponential_mechanism, laplace_noise
from dpfl.stats.inputs import (
    as_bounds,
    check_epsilon,
    check_fraction,
    check_X,
    check_Xy,
    noise_rng,
    plain_rng,
)
from dpfl.stats.ledger import laplace_event, make_ledger, pure_event

CRITERIA = ("infogain", "gini")


def _xlogx(c: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(c > 0, c * np.log2(np.where(c > 0, c, 1.0)), 0.0)


def infogain_utility(counts: np.ndarray) -> np.ndarray:
    """-sum_b tau_b H(class | branch b): counts [..., branches, classes] -> [...] (higher is better)."""
    return (_xlogx(counts).sum(-1) - _xlogx(counts.sum(-1))).sum(-1)


def gini_utility(counts: np.ndarray) -> np.ndarray:
    """-sum_b (tau_b - sum_c tau_bc^2 / tau_b): counts [..., branches, classes] -> [...]."""
    tot = counts.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        sq = np.where(tot > 0, (counts**2).sum(-1) / np.where(tot > 0, tot, 1.0), 0.0)
    return -(tot - sq).sum(-1)


def utility_sensitivity(criterion: str, n: int) -> float:
    """Replace-one sensitivity: twice the add/remove bound of Friedman & Schuster (2010)."""
    if criterion == "infogain":
        return 2.0 * (math.log2(n + 1) + 1.0 / math.log(2))
    return 2.0 * 2.0


class DPRandomForest:
    """ε-DP random-forest classifier. `bounds` = public (lo, hi) of every feature."""

    def __init__(
        self,
        epsilon: float,
        *,
        bounds,
        n_trees: int = 10,
        max_depth: int = 4,
        n_thresholds: int = 8,
        max_features: int | str | None = "sqrt",
        criterion: str = "infogain",
        leaf_fraction: float = 0.5,
        disjoint: bool = False,
        classes=None,
        random_state: int | None = None,
        ledger=None,
    ):
        self.epsilon = check_epsilon(epsilon)
        for name, v, lo in (("n_trees", n_trees, 1), ("max_depth", max_depth, 0), ("n_thresholds", n_thresholds, 1)):
            if int(v) != v or int(v) < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}")
        if criterion not in CRITERIA:
            raise ConfigError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
        if not (max_features is None or max_features == "sqrt" or (isinstance(max_features, int) and max_features >= 1)):
            raise ConfigError(f"max_features must be 'sqrt', None or an integer >= 1, got {max_features!r}")
        self.bounds = bounds
        self.n_trees, self.max_depth, self.n_thresholds = int(n_trees), int(max_depth), int(n_thresholds)
        self.max_features = max_features
        self.criterion = criterion
        self.leaf_fraction = check_fraction(leaf_fraction, "leaf_fraction", 0.0, 1.0 + 1e-12)
        self.disjoint = bool(disjoint)
        self.classes = classes
        self.random_state = random_state
        self.ledger = ledger

    def _budget(self) -> tuple[float, float]:
        eps_tree = self.epsilon if self.disjoint else self.epsilon / self.n_trees
        if self.max_depth == 0:
            return 0.0, eps_tree
        return (1.0 - self.leaf_fraction) * eps_tree / self.max_depth, self.leaf_fraction * eps_tree

    def fit(self, X, y):
        X, y = check_Xy(X, y)
        n, d = X.shape
        self.classes_ = np.unique(y if self.classes is None else np.asarray(self.classes))
        bad = ~np.isin(y, self.classes_)
        if np.any(bad):
            raise DataError(f"y has labels {np.unique(y[bad])} outside classes {self.classes_}")
        if self.disjoint and n < self.n_trees:
            raise DataError(f"disjoint=True needs at least n_trees={self.n_trees} records, got {n}")
        lo, hi = as_bounds(self.bounds, d)
        self.n_features_in_ = d
        k = np.arange(1, self.n_thresholds + 1) / (self.n_thresholds + 1)
        self.thresholds_ = lo[:, None] + (hi - lo)[:, None] * k[None, :]  # [d, T], data independent
        m = d if self.max_features is None else (math.ceil(math.sqrt(d)) if self.max_features == "sqrt" else min(d, self.max_features))
        onehot = np.eye(self.classes_.shape[0])[np.searchsorted(self.classes_, y)]
        prng = plain_rng(self.random_state, "classic", "forest", "structure")
        nrng = noise_rng(self.random_state, "classic", "forest", "noise")
        parts = np.array_split(prng.permutation(n), self.n_trees) if self.disjoint else [np.arange(n)] * self.n_trees
        eps_level, eps_leaf = self._budget()
        self.epsilon_level_, self.epsilon_leaf_ = eps_level, eps_leaf
        # ledger first (nothing is released if the budget refuses): the per-record cost;
        # disjoint trees compose in parallel, so they cost one tree's worth
        tree = [laplace_event(noise_scale=2.0 / eps_leaf, sensitivity=2.0)]
        if self.max_depth > 0:
            tree.insert(0, SelfComposedEvent(pure_event(eps_level), self.max_depth))
        self.ledger_ = make_ledger(self.ledger)
        self.ledger_.add(ComposedEvent(tuple(tree)), count=1 if self.disjoint else self.n_trees)
        self.trees_ = [self._grow(X[p], onehot[p], len(p), m, eps_level, eps_leaf, prng, nrng) for p in parts]
        return self

    def _grow(self, X, onehot, n_public, m, eps_level, eps_leaf, prng, nrng):
        D, T = self.max_depth, self.n_thresholds
        n_inner = 2**D - 1
        feature = np.zeros(n_inner, dtype=np.int64)
        threshold = np.zeros(n_inner)
        node = np.zeros(X.shape[0], dtype=np.int64)
        sens = utility_sensitivity(self.criterion, n_public)
        score = infogain_utility if self.criterion == "infogain" else gini_utility
        for i in range(n_inner):
            feats = np.sort(prng.choice(X.shape[1], size=m, replace=False))
            here = node == i
            xs, oh = X[here][:, feats], onehot[here]
            left = (xs[:, :, None] <= self.thresholds_[feats][None, :, :]).astype(np.float64)  # [r, m, T]
            lcount = np.einsum("rft,rc->ftc", left, oh)
            counts = np.stack([lcount, oh.sum(0)[None, None, :] - lcount], axis=2)  # [m, T, 2, K]
            u = score(counts).reshape(-1)
            j = exponential_mechanism(u, eps_level, sens, nrng)
            feature[i], threshold[i] = feats[j // T], self.thresholds_[feats[j // T], j % T]
            go_right = X[here, feature[i]] > threshold[i]
            node[here] = 2 * i + 1 + go_right
        leaf_counts = np.zeros((2**D, onehot.shape[1]))
        np.add.at(leaf_counts, node - n_inner, onehot)
        noisy = leaf_counts + laplace_noise(leaf_counts.shape, 2.0 / eps_leaf, nrng)
        noisy = np.maximum(noisy, 0.0)
        tot = noisy.sum(1, keepdims=True)
        probs = np.where(tot > 0, noisy / np.where(tot > 0, tot, 1.0), 1.0 / onehot.shape[1])
        return feature, threshold, probs

    def predict_proba(self, X) -> np.ndarray:
        X = check_X(X)
        if X.shape[1] != self.n_features_in_:
            raise DataError(f"X has {X.shape[1]} features, the forest was fit on {self.n_features_in_}")
        out = np.zeros((X.shape[0], self.classes_.shape[0]))
        rows = np.arange(X.shape[0])
        for feature, threshold, probs in self.trees_:
            node = np.zeros(X.shape[0], dtype=np.int64)
            for _ in range(self.max_depth):
                node = 2 * node + 1 + (X[rows, feature[node]] > threshold[node])
            out += probs[node - (2**self.max_depth - 1)]
        return out / len(self.trees_)

    def predict(self, X) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
