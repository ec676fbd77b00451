"""Matrix-factorization mechanisms for client-level DP: DP-FTRL's tree aggregation (Kairouz et al.,
ICML 2021) and banded matrix factorization, BandMF (Choquette-Choo et al., NeurIPS 2023).

Round t = 1..T releases x̂_t = x_t + z̃_t, x_t the round's sum of clipped updates (units of the clip
bound S) and z̃ = F Z with Z i.i.d. N(0, σ²) (m rows). With an encoder C (m × T) and F C = I,
x̂ = F (C x + Z): post-processing of the Gaussian mechanism on C x, also for adaptively chosen x
(C lower triangular: Denisov et al. 2022). The prefix sums the model follows are A x̂ = A x + B Z,
B = A F (A: the workload, prefix sums for FedAvg with server learning rate 1).

A client's contributions u_t (‖u_t‖ ≤ 1 in its rounds, 0 elsewhere) move C x by C u, so the
sensitivity is Δ = max over participation patterns of ‖C u‖ (zero-out: add/remove one client), and the
release is ρ-zCDP with ρ = Δ²/(2σ²), exactly the Gaussian mechanism with multiplier σ/Δ. Patterns
(`dpfl.privacy.participation`): "any" (every round possible), "cyclic" (b groups taking turns),
"min-separation" (rounds of one client ≥ b apart). `sensitivity_squared` gives Δ² of the first r rounds
for every r, exactly where the structure allows it (see there), else an upper bound.

* tree (`tree`): C has one row per dyadic node a prefix of a restart segment uses (the node of size
  2^j ending at p, 2^j the lowest set bit of p: T rows); B's row t adds the nodes of t's binary
  decomposition and, for earlier segments, their final sums. Tree completion: a segment's last prefix
  is read from the root of its tree completed to 2^h ≥ L leaves with virtual zero leaves, so the model
  carried across a restart holds one node's noise instead of popcount(L). The virtual leaves hold no
  data; the root is one more row of C, free when L is a power of two and otherwise one more level in
  a leaf's path (Δ² = ⌈log₂L⌉ + 1 for one participation instead of ⌊log₂L⌋ + 1: the bound Kairouz et
  al. state for any L).
* bandmf (`bandmf`): C lower triangular with b bands, columns of norm 1, optimised for the workload:
  minimise ‖A C⁻¹‖_F² over the b·T band entries with each column normalised (L-BFGS, analytic
  gradient), from the banded Toeplitz square root of the prefix-sum matrix. F = C⁻¹; with rounds of
  one client ≥ b apart the columns they touch are orthogonal, so Δ² = Σ of their squared norms ≤ k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.privacy.events import Event, GaussianEvent, check_delta
from dpfl.privacy.participation import SCHEMAS, check_schema

NodeKey = tuple[int, ...]


@dataclass
class Factorization:
    """A factorization for T rounds: encoder C (m × T), noise map F (T × m, F C = I), the key of
    each of the m noise rows, and what the noise streams need (`dpfl.privacy.correlated`)."""

    name: str  # "tree" | "bandmf"
    encoder: np.ndarray  # C
    noise_map: np.ndarray  # F
    keys: list[NodeKey]  # Z's row j is drawn from stream keys[j]
    segments: list[int] = field(default_factory=list)  # tree: rounds per restart segment
    completion: bool = False  # tree: each segment's last prefix from its completed root
    bands: int = 0  # bandmf: b

    @property
    def rounds(self) -> int:
        return self.encoder.shape[1]

    def workload_error(self, workload: np.ndarray | None = None) -> float:
        """‖A F‖_F²: the total variance of the T prefix sums' noise per unit σ² (A: prefix sums)."""
        return float(np.sum(self.prefix_variances(workload)))

    def prefix_variances(self, workload: np.ndarray | None = None) -> np.ndarray:
        """‖(A F)_t‖² for each round t: the noise variance of the model after round t, per unit σ²
        (independent noise: t)."""
        a = prefix_workload(self.rounds) if workload is None else workload
        return np.sum((a @ self.noise_map) ** 2, axis=1)

    def round_std(self) -> np.ndarray:
        """‖F_t‖ for each round: round t's noise std per unit σ."""
        return np.sqrt(np.sum(self.noise_map ** 2, axis=1))


def _count(name: str, v: int, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise PrivacyError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


# ---- workloads --------------------------------------------------------------------------------------


def prefix_workload(rounds: int) -> np.ndarray:
    """A[t, j] = 1 for j ≤ t: the model after t rounds of FedAvg (server learning rate 1)."""
    return np.tril(np.ones((_count("rounds", rounds), rounds)))


def momentum_workload(rounds: int, beta: float) -> np.ndarray:
    """A[t, j] = (1 − β^(t−j+1))/(1 − β) for j ≤ t: the model under server momentum β."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
        raise PrivacyError(f"momentum β must be in [0, 1), got {beta!r}")
    d = np.subtract.outer(np.arange(rounds), np.arange(_count("rounds", rounds)))
    return np.where(d >= 0, (1 - float(beta) ** (np.maximum(d, 0) + 1)) / (1 - beta), 0.0)


# ---- the tree ---------------------------------------------------------------------------------------


def dyadic(p: int) -> list[tuple[int, int]]:
    """The nodes (level h, index i) of the binary decomposition of the prefix [0, p) of a segment:
    node (h, i) covers leaves [i·2^h, (i+1)·2^h), largest first."""
    out, start = [], 0
    for h in range(max(p, 1).bit_length() - 1, -1, -1):
        if p >> h & 1:
            out.append((h, start >> h))
            start += 1 << h
    return out


def tree_root(length: int) -> tuple[int, int]:
    """The root (h, 0) of a segment of `length` leaves completed to 2^h ≥ length leaves."""
    return (max(0, (length - 1).bit_length()), 0)


def segment_prefix(p: int, length: int, completion: bool) -> list[tuple[int, int]]:
    """The nodes whose noise the segment's p-th prefix holds (p = length with completion: the root)."""
    return [tree_root(length)] if completion and p == length else dyadic(p)


def restart_segments(rounds: int, restart: int | None) -> list[int]:
    """Rounds per tree: `restart` each (the last one shorter), or one tree over all rounds."""
    _count("rounds", rounds)
    r = rounds if restart is None else _count("restart", restart)
    return [min(r, rounds - s) for s in range(0, rounds, r)]


def tree(rounds: int, restart: int | None = None, completion: bool = True) -> Factorization:
    """DP-FTRL's tree aggregation over `rounds`, a fresh tree every `restart` rounds."""
    segments = restart_segments(rounds, restart)
    keys: list[NodeKey] = []
    col: dict[NodeKey, int] = {}
    for s, length in enumerate(segments):
        nodes = {n for p in range(1, length + 1) for n in segment_prefix(p, length, completion)}
        for h, i in sorted(nodes, key=lambda n: (n[0], n[1])):
            col[(s, h, i)] = len(keys)
            keys.append((s, h, i))
    enc = np.zeros((len(keys), rounds))
    b = np.zeros((rounds, len(keys)))
    t0, done = 0, np.zeros(len(keys))
    for s, length in enumerate(segments):
        for (s2, h, i), j in col.items():
            if s2 == s:  # node (h, i) holds leaves [i·2^h, (i+1)·2^h) of the segment (real ones only)
                enc[j, t0 + i * (1 << h) : t0 + min(length, (i + 1) << h)] = 1.0
        for p in range(1, length + 1):
            b[t0 + p - 1] = done
            for h, i in segment_prefix(p, length, completion):
                b[t0 + p - 1, col[(s, h, i)]] += 1.0
        done = b[t0 + length - 1].copy()
        t0 += length
    f = np.diff(b, axis=0, prepend=0.0)  # F = A⁻¹ B: round t's noise is prefix t's minus prefix t − 1's
    return Factorization("tree", enc, f, keys, segments=segments, completion=completion)


# ---- BandMF ----------------------------------------------------------------------------------------


def _toeplitz_sqrt(n: int) -> np.ndarray:
    """Coefficients r_j = binom(2j, j)/4^j of the lower-triangular Toeplitz square root of the
    prefix-sum matrix (Fichtenberger et al. 2023), j < n."""
    r = np.ones(n)
    for j in range(1, n):
        r[j] = r[j - 1] * (2 * j - 1) / (2 * j)
    return r


def _normalise(c: np.ndarray) -> np.ndarray:
    return c / np.sqrt(np.sum(c * c, axis=0))


_BANDMF: dict[tuple, np.ndarray] = {}  # (T, b, workload) -> C: a scheme is built more than once


def bandmf(rounds: int, bands: int, workload: np.ndarray | None = None, max_iter: int = 3000) -> Factorization:
    """BandMF: a b-banded lower-triangular C with unit columns minimising ‖A C⁻¹‖_F² (A: prefix sums
    unless given). Deterministic for its inputs on one machine (L-BFGS from a fixed start)."""
    t, b = _count("rounds", rounds), _count("bands", bands)
    if b > t:
        raise PrivacyError(f"bands b = {b} exceeds the rounds T = {t}")
    a = prefix_workload(t) if workload is None else np.asarray(workload, dtype=np.float64)
    if a.shape != (t, t):
        raise PrivacyError(f"the workload must be {t} × {t}, got {a.shape}")
    key = (t, b, max_iter, a.tobytes())
    if key not in _BANDMF:
        if len(_BANDMF) > 8:
            _BANDMF.clear()
        _BANDMF[key] = _optimise(a, b, max_iter)
        _BANDMF[key].setflags(write=False)
    c = _BANDMF[key]
    from scipy.linalg import solve_triangular

    f = solve_triangular(c, np.eye(t), lower=True)
    return Factorization("bandmf", c, f, [(r,) for r in range(1, t + 1)], bands=b)


def _optimise(a: np.ndarray, b: int, max_iter: int) -> np.ndarray:
    t = a.shape[0]
    d = np.subtract.outer(np.arange(t), np.arange(t))
    mask = (d >= 0) & (d < b)
    if b == 1:
        c = np.eye(t)
    else:
        from scipy.linalg import solve_triangular
        from scipy.optimize import minimize

        eye = np.eye(t)

        def loss(x: np.ndarray) -> tuple[float, np.ndarray]:
            c = np.zeros((t, t))
            c[mask] = x
            norms = np.sqrt(np.sum(c * c, axis=0))
            m = c / norms
            n = solve_triangular(m, eye, lower=True)  # M⁻¹
            w = a @ n
            g = -2.0 * (w.T @ w) @ n.T  # ∂‖A M⁻¹‖²/∂M
            gc = (g - m * np.sum(m * g, axis=0)) / norms  # through the column normalisation
            return float(np.sum(w * w)), gc[mask]

        c0 = np.where(mask, _toeplitz_sqrt(t)[np.maximum(d, 0)], 0.0)
        res = minimize(loss, c0[mask], jac=True, method="L-BFGS-B",
                       options={"maxiter": max_iter, "maxcor": 20, "ftol": 1e-13, "gtol": 1e-9})
        c = np.zeros((t, t))
        c[mask] = res.x
        c = _normalise(c)
        if not np.all(np.isfinite(c)) or np.min(np.abs(np.diag(c))) <= 1e-12:
            raise PrivacyError(f"BandMF optimisation for T = {t}, b = {b} failed ({res.message})")
    return c


# ---- sensitivity -------------------------------------------------------------------------------------


def co_occurring(rounds: int, schema: str, separation: int) -> np.ndarray:
    """bool [T, T]: rounds i ≠ j one client may both take part in under the schema."""
    i, j = np.indices((rounds, rounds))
    if schema == "cyclic":
        return ((i - j) % separation == 0) & (i != j)
    if schema == "min-separation":
        return np.abs(i - j) >= separation
    return i != j


def sensitivity_squared(encoder: np.ndarray, schema: str = "any", separation: int = 1) -> tuple[np.ndarray, bool]:
    """(Δ_r² for r = 1..T, exact): the largest ‖C u‖² over the schema's participation patterns within
    the first r rounds, u_t any vectors of norm ≤ 1 in the pattern's rounds. G = CᵀC.

    Exact when the rounds a client may share never interact (G = 0 there: Δ² = the best pattern's
    Σ G_tt, a longest-path over rounds), or G ≥ 0 there and the patterns are known (any: all rounds;
    cyclic: a group's rounds): then equal vectors attain Σ G_ij. Otherwise an upper bound: Σ|G_ij|
    (any, cyclic), or (min-separation) each round's G_tt plus its k − 1 largest |G_tj| over rounds j it
    may share, k = ⌈T/b⌉ (Cauchy–Schwarz on each pair)."""
    schema, b = check_schema(schema, separation)
    c = np.asarray(encoder, dtype=np.float64)
    t = c.shape[1]
    g = c.T @ c
    co = co_occurring(t, schema, b)
    off = g[co]
    zero = not off.any()
    exact = zero or (schema != "min-separation" and bool((off >= 0).all()))
    h = g if exact else np.abs(g)
    if schema == "any":
        return np.cumsum(np.diag(h) + 2 * np.sum(np.tril(h, -1), axis=1)), exact
    if schema == "cyclic":
        out = np.zeros(t)
        for grp in range(min(b, t)):
            rounds = np.arange(grp, t, b)
            sub = h[np.ix_(rounds, rounds)]
            q = np.cumsum(np.diag(sub) + 2 * np.sum(np.tril(sub, -1), axis=1))
            cur = np.zeros(t)
            cur[rounds] = q
            out = np.maximum(out, np.maximum.accumulate(cur))
        return out, exact
    w = np.diag(g).copy()
    if not zero:  # each pattern round's G_tt plus the k − 1 largest |G_tj| it may share
        k = -(-t // b)
        a = np.where(co, np.abs(g), 0.0)
        w = w + np.sort(a, axis=1)[:, ::-1][:, : k - 1].sum(axis=1)
    best = np.zeros(t + 1)  # best[r]: the best pattern within rounds 1..r, gaps ≥ b
    for r in range(1, t + 1):
        best[r] = max(best[r - 1], best[max(0, r - b)] + w[r - 1])
    return best[1:], zero


def build(name: str, rounds: int, schema: str = "any", separation: int = 1, *, bands: int | None = None,
          restart: int | None = None, completion: bool = True,
          workload_momentum: float | None = None) -> tuple[Factorization, np.ndarray, bool]:
    """(factorization, Δ_r² for r = 1..T, exact) of mechanism `name` ("tree" | "bandmf") for T rounds under
    the participation schema. BandMF's bands default to the separation (at most T) and may not exceed it."""
    schema, sep = check_schema(schema, separation)
    if name == "tree":
        f = tree(rounds, restart, completion)
    elif name == "bandmf":
        b = min(sep, rounds) if bands is None else _count("bands", bands)
        if b > sep:
            raise PrivacyError(f"BandMF with {b} bands needs a client's rounds ≥ {b} apart; the {schema!r} "
                               f"participation allows {sep}")
        w = None if workload_momentum is None else momentum_workload(rounds, workload_momentum)
        f = bandmf(rounds, b, w)
    else:
        raise PrivacyError(f"correlated noise must be 'tree' or 'bandmf', got {name!r}")
    sens2, exact = sensitivity_squared(f.encoder, schema, sep)
    return f, sens2, exact


# ---- accounting -----------------------------------------------------------------------------------


def round_event(sigma: float, sens2: np.ndarray, accounted: float, r: int) -> tuple[GaussianEvent | None, float]:
    """Round r's event and the Δ² accounted after it: the Gaussian whose composition with the earlier
    ones is the Gaussian mechanism of Δ_r (ρ adds: Δ_r² − accounted). Increments below 1e-9 relative
    wait for a later round (the last round takes any rest)."""
    inc = float(sens2[r - 1]) - accounted
    if inc <= 0 or (inc <= 1e-9 * float(sens2[r - 1]) and r < len(sens2)):
        return None, accounted
    return GaussianEvent(sigma / math.sqrt(inc)), float(sens2[r - 1])


def run_events(sigma: float, sens2: np.ndarray) -> list[GaussianEvent]:
    """The events of a run that releases every round, in order."""
    out, acc = [], 0.0
    for r in range(1, len(sens2) + 1):
        e, acc = round_event(sigma, sens2, acc, r)
        if e is not None:
            out.append(e)
    return out


def run_epsilon(sigma: float, sens2: np.ndarray, delta: float, accountant: str = "pld",
                prefix: Sequence[Event] = ()) -> float:
    """ε of a whole run on an add/remove ledger: `prefix` (setup events), then the rounds' events in order."""
    from dpfl.privacy.ledger import Ledger

    led = Ledger(accountant)
    for e in (*prefix, *run_events(sigma, sens2)):
        led.add(e)
    return led.epsilon(check_delta(delta))


def gaussian_epsilon(multiplier: float, delta: float) -> float:
    """Exact ε of the Gaussian mechanism with noise multiplier σ/Δ at δ (Balle–Wang 2018, Thm 8):
    the tight (ε, δ) of one release, and of the whole matrix mechanism."""
    from dpfl.privacy.calibration import analytic_gaussian_delta

    check_delta(delta)
    if analytic_gaussian_delta(multiplier, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while analytic_gaussian_delta(multiplier, hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if analytic_gaussian_delta(multiplier, mid) <= delta else (mid, hi)
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def calibrate(epsilon: float, delta: float, sens2: np.ndarray, accountant: str = "pld",
              prefix: Sequence[Event] = ()) -> float:
    """Smallest σ (to 1e-5 relative, rounded up) whose run (`run_epsilon`) reaches at most ε."""
    from dpfl.privacy.calibration import _bisect, _bracket, calibrate_sigma

    total = float(sens2[-1])
    if not total > 0:
        raise PrivacyError("the sensitivity is 0: nothing to calibrate")
    start = calibrate_sigma(epsilon, delta, 1.0, 1, accountant) * math.sqrt(total)
    eps = lambda s: run_epsilon(s, sens2, delta, accountant, prefix)
    return _bisect(eps, *_bracket(eps, start, epsilon), epsilon)[1]


__all__ = ["SCHEMAS", "Factorization", "bandmf", "build", "calibrate", "gaussian_epsilon", "momentum_workload",
           "prefix_workload", "round_event", "run_epsilon", "run_events", "sensitivity_squared", "tree"]
