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
