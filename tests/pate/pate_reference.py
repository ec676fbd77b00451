"""Independent references for PATE tests: exact noisy-max output probabilities by quadrature."""

import itertools
import math

import numpy as np
from scipy import integrate


def noisy_max_probs(counts, dist) -> np.ndarray:
    """P[argmax(counts + iid noise) = j] for a noise distribution given as (pdf, cdf)."""
    pdf, cdf = dist
    n = np.asarray(counts, dtype=float)
    cuts = sorted(set(n.tolist()))
    edges = [-np.inf] + cuts + [np.inf]
    out = []
    for j in range(len(n)):
        others = np.delete(n, j)

        def h(x, j=j, others=others):
            return pdf(x - n[j]) * math.prod(cdf(x - o) for o in others)

        out.append(
            sum(integrate.quad(h, a, b, limit=200, epsabs=1e-13)[0] for a, b in itertools.pairwise(edges))
        )
    return np.array(out)


def neighbours(counts):
    """Vote vectors where one teacher moved its vote from class a to class c."""
    n = np.asarray(counts, dtype=int)
    for a in range(len(n)):
        for c in range(len(n)):
            if a != c and n[a] > 0:
                m = n.copy()
                m[a] -= 1
                m[c] += 1
                yield m


def laplace(gamma):
    """Lap(1/γ) pdf and cdf."""
    return (
        lambda x: 0.5 * gamma * math.exp(-gamma * abs(x)),
        lambda x: 0.5 * math.exp(gamma * x) if x < 0 else 1 - 0.5 * math.exp(-gamma * x),
    )


def gauss(sigma):
    """N(0, σ²) pdf and cdf."""
    return (
        lambda x: math.exp(-0.5 * (x / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi)),
        lambda x: 0.5 * math.erfc(-x / (sigma * math.sqrt(2))),
    )


def all_histograms(teachers, m):
    """Every vote histogram of `teachers` votes over `m` classes."""
    return [c for c in itertools.product(range(teachers + 1), repeat=m) if sum(c) == teachers]


def smooth_sensitivity_bfs(vs, f, beta):
    """Exact β-smooth sensitivity of f (values on histograms `vs`) over the vote-move graph:
    max_k e^{−βk} max{local sensitivity at n' : n' at distance <= k}. Returns (values, neighbour lists)."""
    pos = {tuple(v): i for i, v in enumerate(vs)}
    nbs = [[pos[tuple(w)] for w in neighbours(v)] for v in vs]
    ls = np.array([max(abs(f[j] - f[i]) for j in nb) for i, nb in enumerate(nbs)])
    out = np.zeros(len(vs))
    for i in range(len(vs)):
        seen, frontier, a = {i}, {i}, ls[i]
        out[i] = a
        for k in range(1, len(vs)):
            frontier = {w for u in frontier for w in nbs[u]} - seen
            if not frontier:
                break
            seen |= frontier
            a = max(a, ls[list(frontier)].max())
            out[i] = max(out[i], math.exp(-beta * k) * a)
    return out, nbs
