"""Neighbour graphs for secure aggregation and the security each one gives.

- complete graph (SecAgg, Bonawitz et al. 2017): every pair of clients shares a mask; each
  client Shamir-shares its secrets with all others.
- sparse graph (SecAgg+, Bell et al. 2020): the Harary graph H(n, k) — clients on a cycle,
  each joined to the k/2 nearest on either side — with the clients placed on the cycle by a
  random permutation the server draws after the clients are fixed. Each client masks with
  and shares to its k neighbours only, so its cost is O(k) instead of O(n).

Security in the semi-honest model (the server plus a set C of corrupt clients, unknown to the
permutation; D the clients that drop out). The server learns more than the sum of the
surviving honest inputs only if
  (i)  some honest client u has ≥ t corrupt neighbours: they hold t shares of both of u's
       secrets (mask key and self-mask seed), so with the honest shares of the other one
       the server unmasks x_u; or
  (ii) the graph on honest survivors H = V \\ (C ∪ D) is disconnected: pair masks with corrupt
       or dropped clients become known, so the server learns the sum of each component.
`failure_bound` bounds P[(i) or (ii)] over the random placement:
  (i)  ≤ |H| · P[Hypergeometric(n − 1, |C|, k) ≥ t];
  (ii) on the circulant graph a neighbour edge spans at most h = k/2 positions, so H is
       disconnected only if the removed set R = C ∪ D contains two disjoint runs of h
       consecutive positions: ≤ (n²/2) · C(n − 2h, |R| − 2h) / C(n, |R|).
The security parameter is −log2 of that bound (∞ when both terms are 0; for the complete graph
(ii) is impossible and (i) needs |C| ≥ t). These are our bounds for the Harary construction
used in practice; Bell et al. analyse Erdős–Rényi graphs with the same two conditions.
"""

from __future__ import annotations

import math

import numpy as np

from dpfl.errors import ConfigError
from dpfl.rng import CryptoRNG


def complete_graph(n: int) -> dict[int, tuple[int, ...]]:
    """Every client is a neighbour of every other."""
    if n < 2:
        raise ConfigError(f"secure aggregation needs at least 2 clients, got {n}")
    return {u: tuple(v for v in range(n) if v != u) for u in range(n)}


def check_sparse_degree(n: int, k: int) -> int:
    """k, if it is a valid SecAgg+ degree for n clients (an even integer in [2, n − 2])."""
    if n < 2:
        raise ConfigError(f"secure aggregation needs at least 2 clients, got {n}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2 or k % 2 or k >= n - 1:
        raise ConfigError(
            f"neighbours k must be an even integer in [2, {n - 2}] for n = {n} (use None for all)"
        )
    return int(k)


def harary_graph(n: int, k: int, rng: CryptoRNG) -> dict[int, tuple[int, ...]]:
    """k-regular Harary graph H(n, k) (k even) on a random cyclic order of clients 0..n−1."""
    check_sparse_degree(n, k)
    order = np.argsort(rng.uint64(n), kind="stable")  # uniformly random permutation
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    h = k // 2
    return {u: tuple(sorted(int(order[(pos[u] + s) % n]) for s in range(-h, h + 1) if s)) for u in range(n)}


def _check_degree(degree: int) -> int:
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
        raise ConfigError(f"degree must be an integer ≥ 1, got {degree!r}")
    return int(degree)


def min_threshold(degree: int) -> int:
    """The smallest safe Shamir threshold: t with 2t > degree + 1. A client's self-mask seed has
    degree + 1 shares (its neighbours' and its own) and its mask key degree shares; a server can
    collect at most degree + 1 revealed shares about one client, so it never gets t of both."""
    return (_check_degree(degree) + 1) // 2 + 1


def default_threshold(degree: int) -> int:
    """Shamir threshold t = ⌊(degree + 1)/2⌋ + 1, the smallest safe one (`min_threshold`): a
    majority of a client and its neighbours. It tolerates the most lost clients (`max_tolerated`)."""
    return min_threshold(degree)


def max_tolerated(degree: int, t: int) -> int:
    """The most lost clients l that every round survives, whichever they are: degree + 1 − t.

    With l clients lost after sharing keys, a survivor still holds its own share of its self-mask
    seed and those of its ≥ degree − l surviving neighbours; a lost client's mask key is held by
    ≥ degree − (l − 1) survivors. Both reach t iff degree + 1 − l ≥ t. Exact for the complete graph
    (degree n − 1); in a SecAgg+ graph it is the worst case (all l among one survivor's neighbours)."""
    degree = _check_degree(degree)
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 1 <= t <= degree + 1:
        raise ConfigError(f"threshold t must be an integer in [1, {degree + 1}] for degree {degree}, got {t!r}")
    return degree + 1 - int(t)


def check_tolerance(n: int, degree: int, t: int, tolerate: int) -> None:
    """ConfigError (one line: n, l, t and the largest l) unless every round of n clients survives
    `tolerate` = l lost clients (`max_tolerated`)."""
    if isinstance(tolerate, bool) or not isinstance(tolerate, (int, np.integer)) or tolerate < 0:
        raise ConfigError(f"tolerated dropouts l must be an integer ≥ 0, got {tolerate!r}")
    most = max_tolerated(degree, t)
    if tolerate > most:
        raise ConfigError(
            f"secure aggregation of n = {n} clients (degree {degree}) at threshold t = {t} cannot tolerate "
            f"l = {tolerate} lost clients: at most l = {most} (a survivor keeps degree + 1 − l shares, t needed)"
        )


def failure_bound(n: int, k: int, t: int, corrupt: int, dropped: int) -> float:
    """Upper bound on P[the server learns more than the survivors' sum] (module docstring)."""
    if not (0 <= corrupt and 0 <= dropped and corrupt + dropped <= n and 1 <= t <= k + 1 and k <= n - 1):
        raise ConfigError(
            f"need 1 ≤ t ≤ k + 1, k ≤ n − 1 and corrupt + dropped ≤ n; got n={n} k={k} t={t} "
            f"corrupt={corrupt} dropped={dropped}"
        )
    from scipy import stats  # here only: the protocol imports this module on clients, without SciPy

    honest = n - corrupt
    share_leak = honest * float(stats.hypergeom.sf(t - 1, n - 1, corrupt, k)) if corrupt >= t else 0.0
    if k == n - 1:
        return min(1.0, share_leak)
    h, r = k // 2, corrupt + dropped
    split = 0.0
    if r >= 2 * h and n - r >= 2:
        split = (n * n / 2) * math.comb(n - 2 * h, r - 2 * h) / math.comb(n, r)
    return min(1.0, share_leak + split)


def security_bits(n: int, k: int, t: int, corrupt: int, dropped: int) -> float:
    """−log2(failure_bound): ∞ when no placement of the clients can break it."""
    p = failure_bound(n, k, t, corrupt, dropped)
    return math.inf if p == 0 else -math.log2(p)
