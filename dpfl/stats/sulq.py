"""SuLQ noisy counts (Blum, Dwork, McSherry & Nissim 2005), over one database or a federation.

A query (S, f) returns sum_{r in S} f(d_r) + N(0, sigma^2) (the survey's "DB_R" is a typo for
d_r). Here S is folded into the predicate: r -> [r in S] * f(r). With clients, each adds a
share N(0, sigma^2 / k) before the (secure) sum. Every answer adds a Gaussian event to the
ledger (one record moves a count by at most 1).

`conf(p) = log(p / (1 - p))` is SuLQ's confidence; `posterior_confidence` tracks how an
adversary who knows every other row updates its confidence that f(d_i) = 1 from the answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from dpfl.errors import ConfigError, DataError
from dpfl.stats.inputs import noise_rng
from dpfl.stats.ledger import gaussian_event, make_ledger
from dpfl.stats.noisy_sum import Summer, noisy_sum, plain_sum


def conf(p):
    """The log-odds map (0, 1) -> R (survey eq. 3.2)."""
    p = np.asarray(p, dtype=np.float64)
    if np.any((p <= 0) | (p >= 1)):
        raise ConfigError(f"conf(p) needs 0 < p < 1, got {p}")
    return np.log(p) - np.log1p(-p)


def posterior_confidence(prior: float, answers, others, sigma: float) -> np.ndarray:
    """conf of the belief f(d_i)=1 after each answer, for an adversary who knows the count
    `others[t]` of every other row: each answer a adds log N(a; c+1, s^2) - log N(a; c, s^2)
    = (2 (a - c) - 1) / (2 s^2). Returns [conf_0, ..., conf_T]."""
    a = np.asarray(answers, dtype=np.float64)
    c = np.asarray(others, dtype=np.float64)
    if a.shape != c.shape or a.ndim != 1:
        raise DataError(f"answers and others must be 1-D of equal length, got {a.shape} and {c.shape}")
    steps = (2.0 * (a - c) - 1.0) / (2.0 * sigma**2)
    return float(conf(prior)) + np.concatenate([[0.0], np.cumsum(steps)])


class SuLQ:
    """Noisy predicate counts over `clients` (a list of row arrays; one entry = one database)."""

    def __init__(
        self,
        clients: Sequence,
        *,
        sigma: float,
        summer: Summer = plain_sum,
        random_state: int | None = None,
        ledger=None,
    ):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise ConfigError(f"sigma must be a finite number > 0, got {sigma!r}")
        if len(clients) == 0:
            raise DataError("SuLQ needs at least one client database")
        self.clients = [np.asarray(c) for c in clients]
        self.sigma = float(sigma)
        self.summer = summer
        self.random_state = random_state
        self.ledger = make_ledger(ledger)  # pass a ledger with a Budget to cap the number of queries
        self.n_queries = 0

    def query(self, predicate: Callable[[np.ndarray], np.ndarray]) -> float:
        """sum over all rows of predicate(rows) (a 0/1 vector per client) plus N(0, sigma^2)."""
        counts = []
        for k, rows in enumerate(self.clients):
            f = np.asarray(predicate(rows))
            if f.shape != (rows.shape[0],) or not np.all((f == 0) | (f == 1)):
                raise DataError(f"predicate must return one 0/1 value per row; client {k} gave shape {f.shape}")
            counts.append([float(f.sum())])
        self.ledger.add(gaussian_event(sigma=self.sigma, sensitivity=1.0))
        rngs = [noise_rng(self.random_state, "stats", "sulq", self.n_queries, "client", k) for k in range(len(counts))]
        self.n_queries += 1
        return float(noisy_sum(np.asarray(counts), rngs, gaussian_sigma=self.sigma, summer=self.summer)[0])
