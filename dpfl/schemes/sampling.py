"""Client selection and local batch sampling, reproducible from named seeds."""

from __future__ import annotations

import numpy as np


def select_fixed(n_clients: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct clients uniformly at random (thesis)."""
    if not 0 < k <= n_clients:
        raise ValueError(f"cohort size must be in [1, {n_clients}], got {k}")
    return np.sort(rng.choice(n_clients, size=k, replace=False))


def select_poisson(n_clients: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """Each client independently with probability q (what the accountants assume)."""
    return np.flatnonzero(rng.random(n_clients) < q)


def drop(cohort: np.ndarray, rate: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split a cohort into (answering, dropped): each selected client fails with probability `rate`."""
    if rate <= 0:
        return cohort, cohort[:0]
    fail = rng.random(cohort.size) < rate
    return cohort[~fail], cohort[fail]


def local_positions(sizes: np.ndarray, steps: int, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each client, `steps*batch` positions in its own data: successive random permutations
    (epochs without replacement), cut into batches."""
    need = steps * batch
    out = []
    for n in sizes:
        n = int(n)
        reps = -(-need // n)
        out.append(np.concatenate([rng.permutation(n) for _ in range(reps)])[:need].reshape(steps, batch))
    return out


def poisson_positions(sizes: np.ndarray, steps: int, batch: int, rngs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Record-level DP-SGD batches: at each step every record of client k is taken independently
    with probability q_k = min(1, batch / n_k), from that client's own `rngs[k]` (CryptoRNG: the
    sample is secret). Returns (positions [k, steps, M], weight [k, steps, M] float32, q [k]):
    M is the largest batch drawn, shorter batches are padded with position 0 and weight 0."""
    sizes = np.asarray(sizes, dtype=np.int64)
    q = np.minimum(1.0, batch / sizes.astype(np.float64))
    taken = [rng.uniform(steps * int(n)).reshape(steps, int(n)) < qk for rng, n, qk in zip(rngs, sizes, q)]
    m = max([1, *(int(t.sum(1).max()) for t in taken)])
    pos = np.zeros((len(sizes), steps, m), dtype=np.int64)
    weight = np.zeros((len(sizes), steps, m), dtype=np.float32)
    for c, t in enumerate(taken):
        for s in range(steps):
            p = np.flatnonzero(t[s])
            pos[c, s, : p.size] = p
            weight[c, s, : p.size] = 1.0
    return pos, weight, q
