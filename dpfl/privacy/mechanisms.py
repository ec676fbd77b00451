"""DP mechanisms (NumPy; the Gaussian is dpfl.rng's ziggurat). ``rng`` is a numpy Generator or a ``dpfl.rng.CryptoRNG``;
``secure=True`` draws from a CryptoRNG keyed from the OS (a numpy Generator is then refused).

Continuous noise (Laplace, Gaussian) is built from 53-bit uniforms in (0, 1); prefer the
integer samplers (discrete Gaussian / Laplace) where floating-point side channels matter
(Mironov 2012). Noise scales here are absolute; calibrate them with ``dpfl.privacy.calibration``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpfl.errors import PrivacyError
from dpfl.privacy.samplers import (  # noqa: F401  (re-exported: the lattice samplers)
    discrete_gaussian,
    discrete_gaussian_exact,
    discrete_laplace,
    discrete_laplace_exact,
    discrete_laplace_tv_bound,
    sampler_tv_bound,
    source,
)


def _pos(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PrivacyError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def _values(name: str, x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise PrivacyError(f"{name} must be finite numbers")
    return a


def laplace_noise(shape, scale: float, rng=None, *, secure: bool = False) -> np.ndarray:
    """Lap(0, scale) noise: scale * (log U1 - log U2) (difference of two exponentials)."""
    b = _pos("scale", scale)
    src = source(rng, secure)
    n = int(np.prod(shape))
    u = src.uniform_open(2 * n).reshape(2, n)
    return (b * (np.log(u[0]) - np.log(u[1]))).reshape(shape)


def gaussian_noise(shape, sigma: float, rng=None, *, secure: bool = False) -> np.ndarray:
    """N(0, sigma^2) noise in float64 from dpfl's one Gaussian sampler (`dpfl.rng.gauss`, the
    ziggurat on 64-bit words): from a CryptoRNG the values of `CryptoRNG.gaussian_into` and
    `dpfl.pate.noise.gaussian`; from a numpy Generator the same transform on its 64-bit words.
    Single-threaded: callers draw one client's share per thread."""
    from dpfl.rng import gaussian_cpu

    s = _pos("sigma", sigma)
    src = source(rng, secure)
    n = int(np.prod(shape))
    z = torch.empty(n, dtype=torch.float64)
    if src.crypto:
        return src.rng.gaussian_into(z, s).numpy().reshape(shape)
    gen = src.rng
    words = lambda m: gen.integers(0, 1 << 64, size=m, dtype=np.uint64).view(np.int64)
    return gaussian_cpu(words, z, s).numpy().reshape(shape)


def laplace_mechanism(value, scale: float, rng=None, *, secure: bool = False):
    """value + Lap(scale) per coordinate: (sensitivity_L1 / scale)-DP."""
    v = _values("value", value)
    return v + laplace_noise(v.shape, scale, rng, secure=secure)


def gaussian_mechanism(value, sigma: float, rng=None, *, secure: bool = False):
    """value + N(0, sigma^2) per coordinate (account it as GaussianEvent(sigma / sensitivity_L2))."""
    v = _values("value", value)
    return v + gaussian_noise(v.shape, sigma, rng, secure=secure)


def exponential_mechanism_probs(utilities, epsilon: float, sensitivity: float = 1.0, monotonic: bool = False):
    """Output probabilities proportional to exp(eps u / (2 Delta)) (exp(eps u / Delta) if monotonic),
    computed stably (shifted by the max utility)."""
    u = _values("utilities", utilities)
    if u.ndim != 1 or u.size == 0:
        raise PrivacyError("utilities must be a non-empty 1-D array")
    k = _pos("epsilon", epsilon) / ((1 if monotonic else 2) * _pos("sensitivity", sensitivity))
    z = k * (u - u.max())
    p = np.exp(z)
    return p / p.sum()


def exponential_mechanism(
    utilities,
    epsilon: float,
    sensitivity: float = 1.0,
    rng=None,
    *,
    monotonic: bool = False,
    secure: bool = False,
) -> int:
    """Index r with probability proportional to exp(eps u_r / (2 Delta)): eps-DP (McSherry-Talwar)."""
    p = exponential_mechanism_probs(utilities, epsilon, sensitivity, monotonic)
    src = source(rng, secure)
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, src.uniform_open(1)[0] * c[-1], side="right"), p.size - 1))


def report_noisy_max(
    values,
    epsilon: float,
    sensitivity: float = 1.0,
    rng=None,
    *,
    monotonic: bool = False,
    secure: bool = False,
) -> int:
    """argmax_i (v_i + Lap(2 Delta/eps)) (Lap(Delta/eps) for monotonic queries, e.g. counts): eps-DP."""
    v = _values("values", values)
    if v.ndim != 1 or v.size == 0:
        raise PrivacyError("values must be a non-empty 1-D array")
    b = (1 if monotonic else 2) * _pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
    return int(np.argmax(v + laplace_noise(v.shape, b, rng, secure=secure)))


def above_threshold(
    queries, threshold: float, epsilon: float, sensitivity: float = 1.0, rng=None, *, secure: bool = False
) -> int | None:
    """Dwork-Roth AboveThreshold: T^ = T + Lap(2D/eps); first i with q_i + Lap(4D/eps) >= T^,
    or None. eps-DP however many queries are below threshold."""
    q = _values("queries", queries).reshape(-1)
    eps, d = _pos("epsilon", epsilon), _pos("sensitivity", sensitivity)
    t = float(_values("threshold", threshold))
    src = source(rng, secure)
    t_hat = t + laplace_noise((1,), 2 * d / eps, src.rng)[0]
    hit = np.flatnonzero(q + laplace_noise(q.shape, 4 * d / eps, src.rng) >= t_hat)
    return int(hit[0]) if hit.size else None


def sparse_vector(
    queries,
    threshold: float,
    epsilon: float,
    c: int,
    sensitivity: float = 1.0,
    rng=None,
    *,
    secure: bool = False,
) -> list[int]:
    """Dwork-Roth Sparse (delta = 0): up to c above-threshold answers, each an AboveThreshold
    with budget eps/c and a fresh noisy threshold; eps-DP in total. Returns the indices of the
    above-threshold answers (halts after the c-th)."""
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        raise PrivacyError(f"c (number of above-threshold answers) must be an integer >= 1, got {c!r}")
    q = _values("queries", queries).reshape(-1)
    s = 2 * c * _pos("sensitivity", sensitivity) / _pos("epsilon", epsilon)
    t = float(_values("threshold", threshold))
    src = source(rng, secure)
    out: list[int] = []
    start = 0
    while len(out) < c and start < q.size:
        t_hat = t + laplace_noise((1,), s, src.rng)[0]
        rest = q[start:]
        hit = np.flatnonzero(rest + laplace_noise(rest.shape, 2 * s, src.rng) >= t_hat)
        if not hit.size:
            break
        out.append(start + int(hit[0]))
        start += int(hit[0]) + 1
    return out


def rr_keep_probability(epsilon: float) -> float:
    """Probability of answering truthfully; the rest is a fair coin: (e^eps - 1)/(e^eps + 1)."""
    e = _pos("epsilon", epsilon)
    return math.tanh(e / 2)


def randomized_response(truth, epsilon: float = math.log(3), rng=None, *, secure: bool = False) -> np.ndarray:
    """Randomized response on bits: answer truthfully with probability tanh(eps/2), else a fair
    coin, so P(yes | yes) / P(yes | no) = e^eps. eps = ln 3 is the notes' coin-flip survey."""
    t = np.asarray(truth)
    if t.dtype != bool:
        raise PrivacyError(f"truth must be a boolean array, got dtype {t.dtype}")
    p = rr_keep_probability(epsilon)
    src = source(rng, secure)
    u = src.uniform_open(2 * t.size).reshape(2, -1)
    keep = u[0] < p
    return np.where(keep, t.reshape(-1), u[1] < 0.5).reshape(t.shape)


def rr_estimate(responses, epsilon: float = math.log(3)) -> float:
    """Unbiased estimate of the true "yes" fraction: (mean - (1-p)/2) / p, p = tanh(eps/2)
    (2 x mean - 1/2 for eps = ln 3)."""
    r = np.asarray(responses)
    if r.dtype != bool or r.size == 0:
        raise PrivacyError("responses must be a non-empty boolean array")
    p = rr_keep_probability(epsilon)
    return float((r.mean() - (1 - p) / 2) / p)
