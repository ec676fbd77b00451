"""ε-DP linear SVM: SMO-style training of the dual, Laplace noise on the released weights.

Training solves the soft-margin dual  max_a sum a_i - 1/2 ||sum a_i y_i z_i||^2,  0 <= a_i <= C,
by sequential minimal optimisation: each step picks the maximal KKT violator and solves for
it in closed form. The intercept is folded into z (an extra constant coordinate, see
`to_unit_ball`), so there is no equality constraint and each working set is one variable.

Privacy (deviation from Zhang, Hao & Wang 2019, which scale Laplace noise on the dual
variables by a ratio of support-vector expectations): the dual variables never leave the
curator; what is released is w = sum a_i y_i z_i plus Laplace noise. Its sensitivity follows
from the primal 1/2 ||w||^2 + C sum hinge_i, which is 1-strongly convex: replacing one record
(||z|| <= 1) moves the optimum by at most 2C in L2. SMO stops once the duality gap g satisfies
sqrt(2 g) <= gap_tol * C, so the released w is within gap_tol * C of the optimum and the
L2 sensitivity is 2C (1 + gap_tol). Laplace noise per coordinate uses the L1 bound
sqrt(d) times that.
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.privacy.mechanisms import laplace_noise
from dpfl.stats.inputs import check_epsilon, check_X, check_Xy, noise_rng, to_unit_ball
from dpfl.stats.ledger import laplace_event, make_ledger


def smo_dual(Z: np.ndarray, s: np.ndarray, C: float, max_gap: float, max_iter: int) -> tuple[np.ndarray, float, int]:
    """Dual variables a (0 <= a <= C) of the soft-margin SVM, duality gap <= max_gap.

    Returns (a, gap, iterations). Raises PrivacyError if the gap is not reached, since the
    sensitivity bound relies on it.
    """
    n = Z.shape[0]
    a = np.zeros(n)
    q = np.einsum("ij,ij->i", Z, Z)
    a[q == 0] = C  # a zero row only adds a_i to the dual
    Ys = Z * s[:, None]
    w = Ys.T @ a
    G = s * (Z @ w) - 1.0  # gradient of the (minimised) negative dual
    gap = math.inf
    for it in range(max_iter):
        if it % 64 == 0:
            w = Ys.T @ a  # exact w(a): the vector that will be released
            G = s * (Z @ w) - 1.0
            gap = float(w @ w + C * np.maximum(0.0, -G).sum() - a.sum())
            if gap <= max_gap:
                return a, gap, it
        pg = np.where(a <= 0.0, np.minimum(G, 0.0), np.where(a >= C, np.maximum(G, 0.0), G))
        pg[q == 0] = 0.0
        i = int(np.argmax(np.abs(pg)))
        if pg[i] == 0.0:
            continue
        new = min(max(a[i] - G[i] / q[i], 0.0), C)
        da = new - a[i]
        a[i] = new
        G += da * s * (Z @ Ys[i])
    w = Ys.T @ a
    G = s * (Z @ w) - 1.0
    gap = float(w @ w + C * np.maximum(0.0, -G).sum() - a.sum())
    if gap <= max_gap:
        return a, gap, max_iter
    raise PrivacyError(
        f"SMO stopped after max_iter={max_iter} with duality gap {gap:.3g} > {max_gap:.3g}; the sensitivity "
        "bound needs the gap: raise max_iter or gap_tol"
    )


class DPSVM:
    """ε-DP binary linear SVM (SMO on the dual, Laplace output perturbation)."""

    def __init__(
        self,
        epsilon: float,
        *,
        C: float = 1.0,
        bounds=None,
        fit_intercept: bool = True,
        gap_tol: float = 0.01,
        max_iter: int = 200_000,
        random_state: int | None = None,
        ledger=None,
    ):
        self.epsilon = check_epsilon(epsilon)
        if not (math.isfinite(float(C)) and float(C) > 0):
            raise ConfigError(f"C must be a finite number > 0, got {C!r}")
        if not (0 < float(gap_tol) <= 1):
            raise ConfigError(f"gap_tol must lie in (0, 1], got {gap_tol!r}")
        if int(max_iter) < 1:
            raise ConfigError(f"max_iter must be >= 1, got {max_iter!r}")
        self.C = float(C)
        self.bounds = bounds
        self.fit_intercept = bool(fit_intercept)
        self.gap_tol = float(gap_tol)
        self.max_iter = int(max_iter)
        self.random_state = random_state
        self.ledger = ledger

    def _features(self, X) -> np.ndarray:
        return to_unit_ball(check_X(X), self.bounds, self.fit_intercept)

    def fit(self, X, y):
        X, y = check_Xy(X, y)
        classes = np.unique(y)  # the label set is treated as public
        if classes.shape[0] != 2:
            raise DataError(f"DPSVM is binary: y must have exactly two classes, got {list(classes)}")
        self.classes_ = classes
        s = np.where(y == classes[1], 1.0, -1.0)
        Z = self._features(X)
        d = Z.shape[1]
        self.n_features_in_ = X.shape[1]
        max_gap = (self.gap_tol * self.C) ** 2 / 2.0
        a, self.duality_gap_, self.n_iter_ = smo_dual(Z, s, self.C, max_gap, self.max_iter)
        w = (Z * s[:, None]).T @ a
        self.sensitivity_l2_ = 2.0 * self.C * (1.0 + self.gap_tol)
        self.sensitivity_ = math.sqrt(d) * self.sensitivity_l2_  # L1
        scale = self.sensitivity_ / self.epsilon
        self.ledger_ = make_ledger(self.ledger)
        self.ledger_.add(laplace_event(noise_scale=scale, sensitivity=self.sensitivity_))
        rng = noise_rng(self.random_state, "classic", "DPSVM")
        self.n_support_ = int(np.count_nonzero(a))
        self.coef_ = w + laplace_noise((d,), scale, rng)
        return self

    def decision_function(self, X) -> np.ndarray:
        Z = self._features(X)
        if Z.shape[1] != self.coef_.shape[0]:
            raise DataError(f"X has {X.shape[1]} features, the model was fit on {self.n_features_in_}")
        return Z @ self.coef_

    def predict(self, X) -> np.ndarray:
        return self.classes_[(self.decision_function(X) > 0).astype(int)]
