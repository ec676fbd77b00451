"""Renyi-DP curves of the events and the RDP -> (epsilon, delta) conversions.

Two order grids and two conversions:
- ``moments`` (thesis / Abadi et al.): integer lam = 1..32, i.e. RDP orders a = lam + 1, with
  eps = min_lam (alpha(lam) + ln 1/delta) / lam, alpha(lam) = lam * rdp(lam + 1);
- ``rdp``: a fine grid of fractional and integer orders with the improved conversion of
  Canonne-Kamath-Steinke 2020 (Prop. 12) / Asoodeh et al. 2020.
The sampled-Gaussian curve is Mironov-Talwar-Zhang 2019 (closed form for integer orders,
the two-sided series of their Sec. 3.3 for fractional orders, terms taken in absolute value).
Sampling without replacement (replace-one only) takes dp-accounting's curve.

scipy.special (gammaln, log_ndtr; ~0.3 s to import) is imported where a subsampled curve is computed:
stdlib lgamma/erfc would change the last bits of recorded epsilons, so it stays, but off the import path.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.privacy.events import (
    ApproxDPEvent,
    DiscreteGaussianEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    PureDPEvent,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    ZCDPEvent,
)

MOMENTS_LAMBDAS = np.arange(1, 33)  # the thesis / TF moments accountant: lam = 1..32
MOMENTS_ORDERS = (MOMENTS_LAMBDAS + 1).astype(np.float64)
DEFAULT_ORDERS = np.unique(
    np.round(
        np.concatenate(
            [
                np.arange(1.05, 11.0, 0.05),
                np.arange(11, 64, 0.5),
                np.arange(64, 257, 4),
                [320, 384, 512, 768, 1024],
            ]
        ),
        6,
    )
)
_MAX_TERMS = 1000  # series terms for fractional orders (as in dp-accounting)


def check_orders(orders) -> np.ndarray:
    o = np.asarray(orders, dtype=np.float64)
    if o.ndim != 1 or o.size == 0 or not np.all(np.isfinite(o)) or np.any(o <= 1):
        raise PrivacyError("RDP orders must be a non-empty 1-D array of finite values > 1")
    return o


def _log_a_int(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """log A_a = log sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2-k)/(2 sigma^2)) for integer a (A5.3)."""
    from scipy.special import gammaln

    a = orders.astype(np.int64)[:, None]
    k = np.arange(int(a.max()) + 1)[None, :]
    lf = gammaln(np.arange(int(a.max()) + 2) + 1.0)  # log k!
    km = np.minimum(k, a)
    t = (
        lf[a]
        - lf[km]
        - lf[a - km]
        + k * math.log(q)
        + (a - k) * math.log1p(-q)
        + (k * k - k) / (2 * sigma**2)
    )
    t = np.where(k <= a, t, -np.inf)
    m = t.max(axis=1, keepdims=True)  # log-sum-exp (the k = 0 term is finite, so m is)
    return np.log(np.exp(t - m).sum(axis=1)) + m[:, 0]


def _log_erfc(x):
    from scipy.special import log_ndtr

    return math.log(2) + log_ndtr(-x * math.sqrt(2))


def _log_a_frac(q: float, sigma: float, orders: np.ndarray, block: int = 16) -> np.ndarray:
    """log A_a for fractional a: MTZ19 Sec. 3.3, split at z0, summed term by term in blocks.

    Stops an order once both series decrease and their terms are below e^-30 of the total
    (the stopping rule of tensorflow-privacy / dp-accounting); +inf if not within 1000 terms.
    """
    from scipy.special import gammaln

    a = orders[:, None]
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    lq, l1q = math.log(q), math.log1p(-q)
    out = np.full(orders.size, np.inf)
    todo = np.arange(orders.size)
    tot0 = np.full(orders.size, -np.inf)
    tot1 = np.full(orders.size, -np.inf)
    last0 = np.full(orders.size, -np.inf)
    last1 = np.full(orders.size, -np.inf)
    for start in range(0, _MAX_TERMS, block):
        if todo.size == 0:
            break
        i = np.arange(start, min(start + block, _MAX_TERMS))[None, :]
        aa = a[todo]
        j = aa - i
        coef = gammaln(aa + 1) - gammaln(i + 1) - gammaln(j + 1)
        s0 = (
            coef
            + i * lq
            + j * l1q
            + (i * i - i) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        )
        s1 = (
            coef
            + j * lq
            + i * l1q
            + (j * j - j) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        )
        c0 = np.logaddexp.accumulate(np.concatenate([tot0[todo, None], s0], axis=1), axis=1)[:, 1:]
        c1 = np.logaddexp.accumulate(np.concatenate([tot1[todo, None], s1], axis=1), axis=1)[:, 1:]
        total = np.logaddexp(c0, c1)
        p0 = np.concatenate([last0[todo, None], s0[:, :-1]], axis=1)
        p1 = np.concatenate([last1[todo, None], s1[:, :-1]], axis=1)
        stop = (s0 < p0) & (s1 < p1) & (np.maximum(s0, s1) < total - 30)
        hit = stop.any(axis=1)
        first = stop.argmax(axis=1)
        out[todo[hit]] = total[hit, first[hit]]
        tot0[todo], tot1[todo] = c0[:, -1], c1[:, -1]
        last0[todo], last1[todo] = s0[:, -1], s1[:, -1]
        todo = todo[~hit]
    return out


def sampled_gaussian_rdp(q: float, sigma: float, orders) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian (add/remove neighbours) at each order."""
    orders = check_orders(orders)
    if q == 1.0:
        return orders / (2 * sigma**2)
    out = np.empty(orders.size)
    is_int = orders == np.round(orders)
    if is_int.any():
        out[is_int] = _log_a_int(q, sigma, orders[is_int]) / (orders[is_int] - 1)
    if (~is_int).any():
        out[~is_int] = _log_a_frac(q, sigma, orders[~is_int]) / (orders[~is_int] - 1)
    return out


def sampled_wor_gaussian_rdp(q: float, sigma: float, orders) -> np.ndarray:
    """RDP of the Gaussian on a uniformly random fixed-size subset (sampling without replacement,
    replace-one neighbours, sigma relative to the replace-one sensitivity): dp-accounting's
    bound (Wang-Balle-Kasiviswanathan 2019, Thm 27; fractional orders interpolated, Cor. 10)."""
    orders = check_orders(orders)
    if q == 1.0:
        return orders / (2 * sigma**2)
    return np.array(_wor_curve(float(q), float(sigma), tuple(orders.tolist())))


@functools.lru_cache(maxsize=16)
def _wor_curve(q: float, sigma: float, orders: tuple) -> tuple:
    from dp_accounting.rdp import rdp_privacy_accountant as dpa

    # slow on the default grid (orders up to 256 are summed exactly): cached per (q, sigma, orders)
    return tuple(float(v) for v in dpa._compute_rdp_sample_wor_gaussian(q, sigma, orders))


def laplace_rdp(epsilon: float, orders) -> np.ndarray:
    """Laplace mechanism with pure epsilon = sensitivity/scale (Mironov 2017, Prop. 6)."""
    a = check_orders(orders)
    return epsilon + np.log1p((a - 1) * np.expm1(epsilon * (1 - 2 * a)) / (2 * a - 1)) / (a - 1)


def pure_dp_rdp(epsilon: float, orders) -> np.ndarray:
    """Any epsilon-DP mechanism: D_a <= min(eps, a eps^2 / 2) (eps-DP => eps^2/2-zCDP)."""
    a = check_orders(orders)
    return np.minimum(epsilon, a * epsilon**2 / 2)


def leaf_rdp(event: Event, orders, neighbouring: str) -> np.ndarray:
    """RDP curve of one leaf event (not Approx-DP) under the neighbouring relation."""
    orders = check_orders(orders)
    replace = neighbouring == "replace_one"
    if isinstance(event, GaussianEvent):
        sigma = event.noise_multiplier / (2 if replace else 1)
        return orders / (2 * sigma**2)
    if isinstance(event, (SampledGaussianEvent, DiscreteGaussianEvent)):
        sigma, q = event.noise_multiplier, event.q
        if replace:
            if q < 1:
                raise PrivacyError(
                    "the rdp/moments backends account Poisson-subsampled Gaussians only under "
                    "add_remove neighbours; use accountant='pld' for replace_one"
                )
            sigma = sigma / 2
        curve = sampled_gaussian_rdp(q, sigma, orders)
        if isinstance(event, DiscreteGaussianEvent):  # thesis Thm 2-3, per RDP order a = lam + 1
            curve = curve + event.log_moment_correction(orders - 1) / (orders - 1)
        return curve
    if isinstance(event, SampledWithoutReplacementGaussianEvent):
        if not replace:
            raise PrivacyError(
                "sampling without replacement is accounted under replace_one neighbours only "
                "(dp-accounting's SampledWithoutReplacementDpEvent); this ledger uses add_remove"
            )
        return sampled_wor_gaussian_rdp(event.q, event.noise_multiplier / 2, orders)
    if isinstance(event, LaplaceEvent):
        return laplace_rdp((2 if replace else 1) / event.scale, orders)
    if isinstance(event, PureDPEvent):
        return pure_dp_rdp(event.epsilon, orders)
    if isinstance(event, ZCDPEvent):
        return event.xi + event.rho * orders
    if isinstance(event, ApproxDPEvent):
        raise PrivacyError("ApproxDPEvent has no RDP curve (the ledger composes it basically)")
    raise PrivacyError(f"no RDP curve for event {type(event).__name__}")


# ---- conversions -------------------------------------------------------------------------


def epsilon_from_rdp(orders, rdp, delta: float) -> tuple[float, float]:
    """Improved conversion: eps = min_a rdp + log(1-1/a) - log(delta a)/(a-1); (eps, best order)."""
    a, r = check_orders(orders), np.maximum(np.asarray(rdp, dtype=np.float64), 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        eps = r + np.log1p(-1 / a) - np.log(delta * a) / (a - 1)
        eps = np.where(a > 1.01, eps, np.inf)
        eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)  # KL bound delta <= sqrt(1-e^-KL)
        eps = np.where(np.isnan(eps), np.inf, eps)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


def delta_from_rdp(orders, rdp, epsilon: float) -> tuple[float, float]:
    """Improved conversion, inverse direction; (delta, best order)."""
    a, r = check_orders(orders), np.maximum(np.asarray(rdp, dtype=np.float64), 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kl = np.where(r > 0, 0.5 * np.log1p(-np.exp(-r)), -np.inf)
        bound = (a - 1) * (r - epsilon + np.log1p(-1 / a)) - np.log(a)
        logd = np.where(a > 1.01, np.minimum(kl, bound), kl)
        logd = np.where(np.isnan(logd), np.inf, logd)
    i = int(np.argmin(logd))
    return min(1.0, math.exp(min(float(logd[i]), 0.0))), float(a[i])


def epsilon_from_moments(orders, rdp, delta: float) -> tuple[float, float]:
    """Thesis/Abadi tail bound: eps = min_lam (alpha(lam) + ln 1/delta)/lam; (eps, best lam)."""
    a, r = check_orders(orders), np.asarray(rdp, dtype=np.float64)
    eps = np.where(np.isnan(r), np.inf, r + math.log(1 / delta) / (a - 1))
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i] - 1)


def delta_from_moments(orders, rdp, epsilon: float) -> tuple[float, float]:
    """delta = min_lam exp(alpha(lam) - lam eps); (delta, best lam)."""
    a, r = check_orders(orders), np.asarray(rdp, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        logd = np.where(np.isnan(r), np.inf, (a - 1) * (r - epsilon))
    i = int(np.argmin(logd))
    return min(1.0, math.exp(min(float(logd[i]), 0.0))), float(a[i] - 1)
