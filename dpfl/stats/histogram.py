"""DP histograms: noisy counts over a known domain, or over the keys the data holds (stability).

Sensitivity assumption: one record contributes to exactly one bin (or none). The neighbouring
relation is the ledger's (default: a fresh RDP ledger with ``add_remove`` neighbours):

- ``add_remove``: one record more or less changes one count by 1 (L1 sensitivity 1);
- ``replace_one`` (n public, as elsewhere in `dpfl.stats`): two counts change by 1 (L1 2).

`dp_histogram` (known domain: fixed bin edges or a fixed list of categories) adds noise to
every bin, empty ones included, so the set of bins says nothing: Laplace(Δ/ε) in floating point,
or discrete Laplace(Δ/ε) from the exact integer sampler (`discrete_laplace_exact`); both are
ε-DP. Records outside the domain are dropped (they reach no bin). `postprocess=True` rounds
and clips the counts to non-negative integers (post-processing: no privacy cost, but biased).

`stable_histogram` (unknown domain; Korolova, Kenthapadi, Mishra & Ntoulas 2009; Bun, Nissim &
Stemmer 2016) adds Laplace(b) only to the counts of keys present in the data and releases a
key only when its noisy count is >= tau. Under ``add_remove``, b = 1/ε and
tau = 1 + b ln(1 / (2 δ)): a key held by one record only is released with probability
P[1 + Lap(b) >= tau] = exp(-(tau - 1)/b) / 2 = δ, and every other count moves by at most 1 under
Lap(1/ε): (ε, δ)-DP. Under
``replace_one`` the mechanism runs at (ε/2, δ / (1 + e^(ε/2))) for add/remove (a replacement
is a removal then an addition: group privacy gives (ε, δ)). Keys are never invented: a key
with count 0 cannot appear in the output.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from dpfl.errors import ConfigError, DataError, PrivacyError
from dpfl.privacy.events import ApproxDPEvent, LaplaceEvent, PureDPEvent, check_delta
from dpfl.privacy.ledger import Ledger
from dpfl.privacy.mechanisms import laplace_noise
from dpfl.privacy.samplers import discrete_laplace_exact
from dpfl.stats.inputs import check_epsilon, noise_rng

NOISES = ("laplace", "discrete_laplace")


@dataclass
class Histogram:
    """Released bins and their noisy counts; `keys[i]` is a category or an edge pair (lo, hi)."""

    keys: list
    counts: np.ndarray
    epsilon: float
    delta: float
    mechanism: str
    neighbouring: str
    threshold: float | None = None
    ledger: Ledger | None = None


def _ledger(ledger) -> Ledger:
    if ledger is None:
        return Ledger(accountant="rdp", neighbouring="add_remove")
    if not isinstance(ledger, Ledger):
        raise PrivacyError(f"ledger must be a dpfl.privacy.ledger.Ledger, got {type(ledger).__name__}")
    return ledger


def l1_sensitivity(neighbouring: str) -> float:
    """L1 change of a histogram between neighbours when a record reaches at most one bin."""
    return 1.0 if neighbouring == "add_remove" else 2.0


def _values(values) -> np.ndarray:
    v = np.asarray(values)
    if v.ndim != 1:
        raise DataError(f"values must be 1-D (one entry per record), got shape {v.shape}")
    return v


def _bin_counts(v: np.ndarray, bins) -> tuple[list, np.ndarray]:
    try:
        edges = np.asarray(bins, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"bins must be numeric bin edges, got {bins!r}") from None
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise ConfigError("bins must be at least 2 finite, strictly increasing edges")
    if v.dtype.kind not in "iufb":
        raise DataError(f"binning needs numeric values, got dtype {v.dtype}")
    x = v.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise DataError("values contain NaN or infinite entries")
    counts, _ = np.histogram(x, bins=edges)  # the last bin is closed [lo, hi]; values outside are dropped
    return [(float(a), float(b)) for a, b in itertools.pairwise(edges)], counts.astype(np.int64)


def _category_counts(v: np.ndarray, categories) -> tuple[list, np.ndarray]:
    cats = list(categories)
    if len(cats) == 0 or len(set(cats)) != len(cats):
        raise ConfigError("categories must be a non-empty list without repeats")
    index = {c: i for i, c in enumerate(cats)}
    counts = np.zeros(len(cats), dtype=np.int64)
    for x in v.tolist():
        i = index.get(x)
        if i is not None:
            counts[i] += 1
    return cats, counts


def dp_histogram(
    values,
    epsilon: float,
    *,
    bins=None,
    categories=None,
    noise: str = "laplace",
    postprocess: bool = False,
    random_state: int | None = None,
    ledger=None,
) -> Histogram:
    """ε-DP counts over a known domain: numeric bin `bins` (edges) or a list of `categories`."""
    eps = check_epsilon(epsilon)
    if noise not in NOISES:
        raise ConfigError(f"noise must be one of {NOISES}, got {noise!r}")
    if (bins is None) == (categories is None):
        raise ConfigError("give exactly one of bins (edges) or categories")
    v = _values(values)
    keys, counts = _bin_counts(v, bins) if bins is not None else _category_counts(v, categories)
    ledger = _ledger(ledger)
    scale = l1_sensitivity(ledger.neighbouring) / eps
    rng = noise_rng(random_state, "stats", "histogram", noise)
    if noise == "laplace":
        ledger.add(LaplaceEvent(scale=scale))  # relative to one record's contribution C = 1
        noisy = counts + laplace_noise(counts.shape, scale, rng)
    else:
        ledger.add(PureDPEvent(eps))
        noisy = counts + discrete_laplace_exact(scale, rng, size=counts.shape)
    if postprocess:
        noisy = np.maximum(np.rint(noisy), 0).astype(np.int64)
    return Histogram(keys, noisy, eps, 0.0, noise, ledger.neighbouring, None, ledger)


def stability_threshold(epsilon: float, delta: float, neighbouring: str = "add_remove") -> tuple[float, float]:
    """(Laplace scale b, threshold tau) of the stability histogram for (ε, δ) under `neighbouring`."""
    eps = check_epsilon(epsilon)
    delta = check_delta(delta)
    if neighbouring == "replace_one":
        eps, delta = eps / 2.0, delta / (1.0 + math.exp(eps / 2.0))
    elif neighbouring != "add_remove":
        raise PrivacyError(f"neighbouring must be 'add_remove' or 'replace_one', got {neighbouring!r}")
    b = 1.0 / eps
    return b, 1.0 + b * math.log(1.0 / (2.0 * delta))


def stable_histogram(
    values,
    epsilon: float,
    delta: float,
    *,
    postprocess: bool = False,
    random_state: int | None = None,
    ledger=None,
) -> Histogram:
    """(ε, δ)-DP counts of the keys present in `values`; keys with noisy count < tau are dropped."""
    v = _values(values)
    ledger = _ledger(ledger)
    b, tau = stability_threshold(epsilon, delta, ledger.neighbouring)
    if v.dtype.kind == "f" and not np.all(np.isfinite(v)):
        raise DataError("values contain NaN or infinite entries")
    keys, counts = np.unique(v, return_counts=True)  # observed keys only: every count >= 1
    ledger.add(ApproxDPEvent(float(epsilon), float(delta)))
    rng = noise_rng(random_state, "stats", "stable_histogram")
    noisy = counts + laplace_noise(counts.shape, b, rng)
    keep = noisy >= tau
    out = noisy[keep]
    if postprocess:
        out = np.maximum(np.rint(out), 0).astype(np.int64)
    return Histogram(keys[keep].tolist(), out, float(epsilon), float(delta), "stability", ledger.neighbouring,
                     tau, ledger)
