"""Functional mechanism (Zhang et al., VLDB 2012): ε-DP linear and logistic regression by
perturbing the coefficients of the objective, written as a polynomial in w.

With rows z (||z||_2 <= 1) the objective is  f(w) = c^T w + w^T Q w  (+ a constant), where
``c = lin * sum_i t_i z_i`` and the monomial coefficients of Q are ``quad * sum_i z_j z_l``
(doubled off the diagonal):

- linear regression: t = y in [-1, 1], lin = -2, quad = 1   (f = sum (y - z^T w)^2);
- logistic regression: degree-2 Taylor expansion of log(1 + e^{z^T w}) - y z^T w at 0,
  t = 1/2 - y, lin = 1, quad = 1/8.

Under replace-one adjacency the L1 sensitivity of all coefficients together is
``Δ = 2 (|lin| t_max sqrt(d) + quad d)`` (uses ||z||_1 <= sqrt(d)); Zhang et al. quote the looser
2(1 + 2d + d^2) and d^2/4 + 3d, which also count the constant term (not needed: it does not
move the minimiser). Every coefficient gets Lap(Δ/ε).

The noisy quadratic may be indefinite: a ridge λI (data independent, ∝ the noise scale) is
added and non-positive eigen-directions are dropped (Zhang et al.'s regularisation and
spectral trimming).

``budget_split="relevance"`` follows Gong, Pan & Xie (2019): a fraction of ε measures each
feature's relevance to the output (the noisy linear coefficients |sum t z_j|), the top
``strong_fraction`` are *strongly relevant*, and the rest of ε is split between coefficients
that touch a strong feature and the others, in proportion to their relevance mass (clamped to
[0.1, 0.9]). The linear coefficients are then the inverse-variance mix of both releases.

Coefficients are sums over records, so a federation computes them with a (secure) sum:
`fit_federated` adds the Laplace noise as per-client shares (see `dpfl.stats.noisy_sum`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpfl.errors import ConfigError, DataError
from dpfl.stats.inputs import (
    check_epsilon,
    check_fraction,
    check_X,
    check_Xy,
    noise_rng,
    to_unit_ball,
)
from dpfl.stats.ledger import laplace_event, make_ledger
from dpfl.stats.noisy_sum import Summer, noisy_sum, plain_sum

BUDGET_SPLITS = ("uniform", "relevance")


def monomials(Z: np.ndarray) -> np.ndarray:
    """Per-record coefficients of the quadratic monomials w_j w_l (j <= l): [n, d(d+1)/2]."""
    iu = np.triu_indices(Z.shape[1])
    prod = Z[:, iu[0]] * Z[:, iu[1]]
    return np.where(iu[0] == iu[1], 1.0, 2.0) * prod


def monomial_sums(Z: np.ndarray) -> np.ndarray:
    """sum over records of `monomials(Z)`, from Z^T Z (no [n, d^2] intermediate)."""
    iu = np.triu_indices(Z.shape[1])
    return np.where(iu[0] == iu[1], 1.0, 2.0) * (Z.T @ Z)[iu]


def quadratic_from_monomials(coef: np.ndarray, d: int) -> np.ndarray:
    """The symmetric Q with w^T Q w = sum_{j<=l} coef_jl w_j w_l."""
    iu = np.triu_indices(d)
    Q = np.zeros((d, d))
    Q[iu] = np.where(iu[0] == iu[1], coef, coef / 2.0)
    return Q + np.triu(Q, 1).T


def quad_group_bound(s: int, w: int) -> float:
    """max over ||z||_2 <= 1 of the L1 mass of monomials touching the s strong features.

    That mass is a^2 + 2ab with a = ||z_S||_1 <= sqrt(s) p, b = ||z_W||_1 <= sqrt(w) q,
    p^2 + q^2 <= 1: the top eigenvalue of [[s, sqrt(sw)], [sqrt(sw), 0]].
    """
    return (s + math.sqrt(s * s + 4.0 * s * w)) / 2.0


def minimise_quadratic(Q: np.ndarray, c: np.ndarray, ridge: float) -> np.ndarray:
    """argmin c^T w + w^T (Q + ridge I) w over the eigen-directions with positive curvature."""
    ev, V = np.linalg.eigh(Q + ridge * np.eye(Q.shape[0]))
    keep = ev > 1e-12 * max(1.0, float(np.abs(ev).max()))
    return -0.5 * V[:, keep] @ ((V[:, keep].T @ c) / ev[keep])


class _FunctionalMechanism:
    lin = 1.0
    quad = 1.0
    t_max = 1.0

    def __init__(
        self,
        epsilon: float,
        *,
        bounds=None,
        fit_intercept: bool = True,
        budget_split: str = "uniform",
        relevance_fraction: float = 0.1,
        strong_fraction: float = 0.5,
        ridge: float = 1.0,
        random_state: int | None = None,
        ledger=None,
    ):
        self.epsilon = check_epsilon(epsilon)
        if budget_split not in BUDGET_SPLITS:
            raise ConfigError(f"budget_split must be one of {BUDGET_SPLITS}, got {budget_split!r}")
        if not (float(ridge) >= 0 and math.isfinite(float(ridge))):
            raise ConfigError(f"ridge must be a finite number >= 0, got {ridge!r}")
        self.bounds = bounds
        self.fit_intercept = bool(fit_intercept)
        self.budget_split = budget_split
        self.relevance_fraction = check_fraction(relevance_fraction, "relevance_fraction")
        self.strong_fraction = check_fraction(strong_fraction, "strong_fraction", 0.0, 1.0 + 1e-12)
        self.ridge = float(ridge)
        self.random_state = random_state
        self.ledger = ledger

    # --- subclass hooks -------------------------------------------------------------------
    def _targets(self, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # --- fitting ----------------------------------------------------------------------------
    def _features(self, X) -> np.ndarray:
        return to_unit_ball(check_X(X), self.bounds, self.fit_intercept)

    def fit(self, X, y):
        """Fit on one data set (the curator adds the noise)."""
        return self.fit_federated([(X, y)])

    def fit_federated(self, clients: Sequence[tuple], summer: Summer = plain_sum):
        """Fit across clients [(X_k, y_k), ...]: each sends its coefficient sums plus a noise share."""
        if len(clients) == 0:
            raise DataError("fit_federated needs at least one client (X, y)")
        rows_lin, rows_quad = [], []
        for X, y in clients:
            X, y = check_Xy(X, y)
            Z = self._features(X)
            t = self._targets(y)
            rows_lin.append(self.lin * (t[:, None] * Z).sum(axis=0))
            rows_quad.append(self.quad * monomial_sums(Z))
        d = rows_lin[0].shape[0]
        if any(r.shape[0] != d for r in rows_lin):
            raise DataError("all clients must have the same number of features")
        self.n_features_in_ = d - int(self.fit_intercept)
        self.ledger_ = make_ledger(self.ledger)
        rngs = [noise_rng(self.random_state, "classic", type(self).__name__, "client", k) for k in range(len(clients))]
        lin, quad = np.stack(rows_lin), np.stack(rows_quad)
        if self.budget_split == "uniform":
            c, coef, qscale = self._release_uniform(lin, quad, d, rngs, summer)
        else:
            c, coef, qscale = self._release_relevance(lin, quad, d, rngs, summer)
        ridge = self.ridge * math.sqrt(d) * float(np.sqrt(np.mean(np.square(qscale))))
        self.ridge_ = ridge
        self.coef_ = minimise_quadratic(quadratic_from_monomials(coef, d), c, ridge)
        return self

    def _release(self, rows, scale, sensitivity, rngs, summer):
        """One Laplace release (`scale` is the same for all its coordinates)."""
        self.ledger_.add(laplace_event(noise_scale=float(np.max(scale)), sensitivity=sensitivity))
        return noisy_sum(rows, rngs, laplace_scale=scale, summer=summer)

    def _release_uniform(self, lin, quad, d, rngs, summer):
        sens = 2.0 * (abs(self.lin) * self.t_max * math.sqrt(d) + self.quad * d)
        self.sensitivity_ = sens
        scale = sens / self.epsilon
        noisy = self._release(np.hstack([lin, quad]), scale, sens, rngs, summer)
        return noisy[:d], noisy[d:], np.full(quad.shape[1], scale)

    def _release_relevance(self, lin, quad, d, rngs, summer):
        eps1 = self.relevance_fraction * self.epsilon
        eps2 = self.epsilon - eps1
        sens1 = 2.0 * abs(self.lin) * self.t_max * math.sqrt(d)
        scale1 = sens1 / eps1
        c1 = self._release(lin, scale1, sens1, rngs, summer)
        relevance = np.abs(c1)
        n_strong = min(d, max(1, math.ceil(self.strong_fraction * d)))
        strong = np.zeros(d, dtype=bool)
        strong[np.argsort(-relevance, kind="stable")[:n_strong]] = True
        s, w = int(strong.sum()), d - int(strong.sum())
        total = float(relevance.sum())
        share = 1.0 if w == 0 else float(np.clip(relevance[strong].sum() / total if total > 0 else 0.5, 0.1, 0.9))
        iu = np.triu_indices(d)
        touch = strong[iu[0]] | strong[iu[1]]
        group = np.concatenate([strong, touch])  # True: coefficient belongs to the strong group
        sens_s = 2.0 * (abs(self.lin) * self.t_max * math.sqrt(s) + self.quad * quad_group_bound(s, w))
        scale = np.empty(group.shape[0])
        scale[group] = sens_s / (share * eps2)
        rows = np.hstack([lin, quad])
        noisy = np.empty(group.shape[0])
        noisy[group] = self._release(rows[:, group], scale[group], sens_s, rngs, summer)
        if w > 0:
            sens_w = 2.0 * (abs(self.lin) * self.t_max * math.sqrt(w) + self.quad * w)
            scale[~group] = sens_w / ((1.0 - share) * eps2)
            noisy[~group] = self._release(rows[:, ~group], scale[~group], sens_w, rngs, summer)
        self.strong_features_ = strong
        self.sensitivity_ = {"relevance": sens1, "strong": sens_s, "weak": sens_w if w else 0.0}
        # inverse-variance mix of the two releases of the linear coefficients
        v1, v2 = scale1**2, scale[:d] ** 2
        c = (c1 / v1 + noisy[:d] / v2) / (1.0 / v1 + 1.0 / v2)
        return c, noisy[d:], scale[d:]

    def decision_function(self, X) -> np.ndarray:
        Z = self._features(X)
        if Z.shape[1] != self.coef_.shape[0]:
            raise DataError(f"X has {Z.shape[1] - int(self.fit_intercept)} features, the model was fit on "
                            f"{self.n_features_in_}")
        return Z @ self.coef_


class FunctionalLinearRegression(_FunctionalMechanism):
    """ε-DP least squares by the functional mechanism. `y_bounds` = public range of y."""

    lin, quad, t_max = -2.0, 1.0, 1.0

    def __init__(self, epsilon: float, *, y_bounds=None, **kwargs):
        super().__init__(epsilon, **kwargs)
        if y_bounds is not None:
            lo, hi = (float(v) for v in y_bounds)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ConfigError(f"y_bounds must be finite (lo, hi) with lo < hi, got {y_bounds!r}")
        self.y_bounds = y_bounds

    def _targets(self, y):
        y = np.asarray(y, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise DataError("y contains NaN or infinite values")
        if self.y_bounds is None:
            if np.any(np.abs(y) > 1.0):
                raise DataError("y must lie in [-1, 1] when y_bounds=None; pass y_bounds=(lo, hi), its public range")
            return y
        lo, hi = self.y_bounds
        return 2.0 * (np.clip(y, lo, hi) - lo) / (hi - lo) - 1.0

    def predict(self, X) -> np.ndarray:
        p = np.clip(self.decision_function(X), -1.0, 1.0)
        if self.y_bounds is None:
            return p
        lo, hi = self.y_bounds
        return lo + (p + 1.0) * (hi - lo) / 2.0


class FunctionalLogisticRegression(_FunctionalMechanism):
    """ε-DP binary logistic regression by the functional mechanism (degree-2 Taylor objective)."""

    lin, quad, t_max = 1.0, 0.125, 0.5

    def _targets(self, y):
        bad = ~np.isin(y, self.classes_)
        if np.any(bad):
            raise DataError(f"y has labels {np.unique(y[bad])} outside the classes {self.classes_}")
        return 0.5 - (y == self.classes_[1]).astype(np.float64)

    def fit_federated(self, clients, summer: Summer = plain_sum):
        # the label set is treated as public (as is usual for DP classifiers)
        labels = np.unique(np.concatenate([np.asarray(y).ravel() for _, y in clients])) if clients else []
        if len(labels) != 2:
            raise DataError(f"FunctionalLogisticRegression needs exactly two classes in y, got {list(labels)}")
        self.classes_ = labels
        return super().fit_federated(clients, summer)

    def predict_proba(self, X) -> np.ndarray:
        p1 = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p1, p1])

    def predict(self, X) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(int)]
