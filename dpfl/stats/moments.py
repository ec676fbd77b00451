"""ε-DP mean and standard deviation of features across clients (PriMIA-style normalisation stats).

Each feature is clipped to its public range [lo, hi] and mapped to u in [0, 1]. Clients send
sum u and sum (u - 1/2)^2 through a (secure) sum with Laplace noise shares
(`dpfl.stats.noisy_sum`); n = sum n_k is public (replace-one adjacency). Replacing one record
changes each sum coordinate by at most 1 and each squared coordinate by at most 1/4, so the
L1 sensitivities are d and d/4; `mean_fraction` of ε goes to the sums, the rest to the squares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpfl.errors import DataError
from dpfl.stats.inputs import as_bounds, check_epsilon, check_fraction, check_X, noise_rng
from dpfl.stats.ledger import laplace_event, make_ledger
from dpfl.stats.noisy_sum import Summer, noisy_sum, plain_sum


@dataclass
class FeatureStats:
    mean: np.ndarray
    std: np.ndarray
    n: int
    ledger: object


def dp_mean_std(
    clients: Sequence[np.ndarray],
    epsilon: float,
    bounds,
    *,
    mean_fraction: float = 0.5,
    summer: Summer = plain_sum,
    random_state: int | None = None,
    ledger=None,
) -> FeatureStats:
    """DP per-feature mean and std over the union of the clients' rows [n_k, d]."""
    eps = check_epsilon(epsilon)
    frac = check_fraction(mean_fraction, "mean_fraction")
    if len(clients) == 0:
        raise DataError("dp_mean_std needs at least one client array")
    arrays = [check_X(X, f"client {k} data") for k, X in enumerate(clients)]
    d = arrays[0].shape[1]
    if any(a.shape[1] != d for a in arrays):
        raise DataError(f"all clients must have {d} features, got {[a.shape[1] for a in arrays]}")
    lo, hi = as_bounds(bounds, d)
    us = [(np.clip(a, lo, hi) - lo) / (hi - lo) for a in arrays]
    n = sum(a.shape[0] for a in arrays)
    ledger = make_ledger(ledger)
    rngs = [noise_rng(random_state, "stats", "mean_std", "client", k) for k in range(len(arrays))]
    eps_s, eps_q = frac * eps, (1.0 - frac) * eps
    sens_s, sens_q = float(d), d / 4.0
    ledger.add(laplace_event(noise_scale=sens_s / eps_s, sensitivity=sens_s))
    sums = noisy_sum(np.stack([u.sum(0) for u in us]), rngs, laplace_scale=sens_s / eps_s, summer=summer)
    ledger.add(laplace_event(noise_scale=sens_q / eps_q, sensitivity=sens_q))
    sq = noisy_sum(np.stack([((u - 0.5) ** 2).sum(0) for u in us]), rngs, laplace_scale=sens_q / eps_q, summer=summer)
    mean_u = np.clip(sums / n, 0.0, 1.0)
    var_u = np.clip(sq / n - (mean_u - 0.5) ** 2, 0.0, 0.25)
    return FeatureStats(mean=lo + (hi - lo) * mean_u, std=(hi - lo) * np.sqrt(var_u), n=n, ledger=ledger)
