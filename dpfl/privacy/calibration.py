"""Noise calibration: sigma for a target (eps, delta, q, T) under any backend; Laplace and
Gaussian scales for a single release."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dpfl.errors import PrivacyError
from dpfl.privacy import rdp as R
from dpfl.privacy.events import (
    Event,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    check_count,
    check_delta,
    check_q,
)
from dpfl.privacy.ledger import Ledger, check_accountant


def _check_pos(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PrivacyError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def epsilon_for(
    sigma: float,
    q: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    neighbouring: str = "add_remove",
    pld_discretization: float = 1e-4,
) -> float:
    """epsilon after ``steps`` Poisson-subsampled Gaussian rounds (noise multiplier sigma, rate q)."""
    check_accountant(accountant)
    check_count(steps, "steps")
    ledger = Ledger(accountant, neighbouring, pld_discretization=pld_discretization)
    ledger.add(SampledGaussianEvent(sigma, q), count=steps)
    return ledger.epsilon(check_delta(delta))


def epsilon_without_replacement(
    sigma: float, population: int, sample: int, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """epsilon (replace-one neighbours) after ``steps`` rounds that each draw ``sample`` of
    ``population`` units without replacement and add Gaussian noise (multiplier sigma).
    PrivacyError for an accountant that cannot account it (pld)."""
    check_accountant(accountant)
    check_count(steps, "steps")
    ledger = Ledger(accountant, "replace_one")
    ledger.add(SampledWithoutReplacementGaussianEvent(sigma, population, sample), count=steps)
    return ledger.epsilon(check_delta(delta))


def calibrate_sigma(
    target_epsilon: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str = "rdp",
    neighbouring: str = "add_remove",
    rtol: float = 1e-5,
) -> float:
    """Smallest noise multiplier (to relative ``rtol``, rounded up) reaching ``target_epsilon``.

    The returned sigma always satisfies epsilon_for(sigma, ..., accountant) <= target_epsilon.
    pld: searched with PLD discretization 1e-3 (pessimistic, ~1e-4 relative above 1e-4's
    epsilon), then verified (and stepped up if needed) at the default 1e-4.
    """
    target = _check_pos("target_epsilon", target_epsilon)
    check_delta(delta)
    check_q(q)
    check_count(steps, "steps")
    check_accountant(accountant)
    if not 0 < rtol < 0.1:
        raise PrivacyError(f"rtol must be in (0, 0.1), got {rtol}")
    seen: dict[float, float] = {}
    dx = 1e-3 if accountant == "pld" else 1e-4

    def eps(s: float) -> float:
        if s not in seen:
            seen[s] = epsilon_for(s, q, steps, delta, accountant, neighbouring, dx)
        return seen[s]

    # bracket [lo, hi] with eps(lo) > target >= eps(hi)
    hi = 1.0
    while eps(hi) > target:
        hi *= 2
        if hi > 1e7:
            raise PrivacyError(
                f"no sigma <= 1e7 reaches epsilon={target} (delta={delta}, q={q}, steps={steps})"
            )
    lo = hi / 2
    while eps(lo) <= target:
        hi, lo = lo, lo / 2
        if lo < 1e-4:
            raise PrivacyError(
                f"epsilon={target} is reached with sigma < 1e-4: target too loose for calibration"
            )

    def g(x: float) -> float:  # log(eps/target), clipped so brentq never sees 0 or inf
        return max(-50.0, min(50.0, math.log(max(eps(math.exp(x)), 1e-300) / target)))

    from scipy.optimize import brentq  # here: importing scipy.optimize slows every `dpfl privacy` start

    s = math.exp(brentq(g, math.log(lo), math.log(hi), xtol=rtol / 4, rtol=1e-12))
    while eps(s) > target:  # step up to the safe side
        s = min(s * (1 + rtol / 2), hi)
    if accountant == "pld":
        while epsilon_for(s, q, steps, delta, accountant, neighbouring) > target:
            s *= 1 + rtol
    return s


def calibrate_sigma_for_events(
    target_epsilon: float,
    delta: float,
    q: float,
    steps: int,
    accountant: str = "rdp",
    event: Callable[[float], Event] | None = None,
    prefix: Sequence[Event] = (),
    neighbouring: str = "add_remove",
) -> float:
    """Smallest sigma (to 1e-5 relative, rounded up) with epsilon(prefix + steps x event(sigma)) <=
    target_epsilon at delta, under `accountant` and `neighbouring`. Starts from `calibrate_sigma`
    (Poisson-sampled Gaussian) and checks, on a ledger, the events the run will actually record.
    event: sigma -> one step's event (default: SampledGaussianEvent(sigma, q))."""
    s = calibrate_sigma(target_epsilon, delta, q, steps, accountant)
    if event is None and not prefix:
        return s
    event = event or (lambda x: SampledGaussianEvent(x, q))

    def eps(x: float, orders=None) -> float:
        led = Ledger(accountant, neighbouring, orders=orders)
        for e in prefix:
            led.add(e)
        led.add(event(x), count=steps)
        return led.epsilon(delta)

    if neighbouring == "add_remove":
        if eps(s) <= target_epsilon:
            return s  # the events only add to the sampled Gaussian's epsilon: s is the smallest
        return _bisect(eps, *_bracket(eps, s, target_epsilon), target_epsilon)[1]
    # another relation (sampling without replacement): s is only a starting point. Under rdp the
    # search runs on the orders <= 64 (fast; their epsilon is >= the full grid's), then the full grid
    # confirms that sigma / (1 + 1e-5) is not enough there either.
    fast = (lambda x: eps(x, R.DEFAULT_ORDERS[R.DEFAULT_ORDERS <= 64])) if accountant == "rdp" else eps
    lo, hi = _bisect(fast, *_bracket(fast, s, target_epsilon), target_epsilon)
    if fast is eps or eps(lo) > target_epsilon:
        return hi
    return _bisect(eps, *_bracket(eps, lo, target_epsilon), target_epsilon)[1]


def _bracket(eps: Callable[[float], float], s: float, epsilon: float) -> tuple[float, float]:
    """(lo, hi) around s with eps(lo) > epsilon >= eps(hi)."""
    if eps(s) <= epsilon:
        lo, hi = s / 2, s
        while eps(lo) <= epsilon:
            lo, hi = lo / 2, lo
            if lo < 1e-4:
                raise PrivacyError(f"ε = {epsilon} is reached for every σ ≥ 1e-4 with these events")
        return lo, hi
    lo, hi = s, s * 1.05
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e7:
            raise PrivacyError(f"no σ ≤ 1e7 reaches ε = {epsilon} with these events")
    return lo, hi


def _bisect(eps: Callable[[float], float], lo: float, hi: float, epsilon: float) -> tuple[float, float]:
    while hi / lo > 1 + 1e-5:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return lo, hi


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Laplace scale b = sensitivity / epsilon for epsilon-DP."""
    return _check_pos("sensitivity (L1)", sensitivity) / _check_pos("epsilon", epsilon)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork-Roth Thm A.1: sigma = sensitivity sqrt(2 ln(1.25/delta)) / epsilon, only for 0 < eps < 1."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < 1:
        raise PrivacyError(
            f"the classic Gaussian mechanism needs epsilon in (0, 1), got {epsilon!r}; "
            "use analytic_gaussian_sigma for epsilon >= 1"
        )
    check_delta(delta)
    return _check_pos("sensitivity (L2)", sensitivity) * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact delta of the Gaussian mechanism (Balle-Wang 2018, Thm 8):
    Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)."""
    s, d = _check_pos("sigma", sigma), _check_pos("sensitivity (L2)", sensitivity)
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, (int, float))
        or not math.isfinite(epsilon)
        or epsilon < 0
    ):
        raise PrivacyError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    from scipy.special import log_ndtr  # here: see dpfl.privacy.rdp

    l1 = log_ndtr(d / (2 * s) - epsilon * s / d)
    l2 = epsilon + log_ndtr(-d / (2 * s) - epsilon * s / d)
    return max(0.0, float(math.exp(l1) * -math.expm1(l2 - l1)))


def analytic_gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float = 1.0, rtol: float = 1e-10
) -> float:
    """Smallest sigma (rounded up) with analytic_gaussian_delta(sigma, epsilon) <= delta; any epsilon > 0."""
    eps = _check_pos("epsilon", epsilon)
    check_delta(delta)
    d = _check_pos("sensitivity (L2)", sensitivity)
    f = lambda x: math.log(max(analytic_gaussian_delta(math.exp(x), eps, d), 1e-300)) - math.log(delta)
    lo, hi = math.log(d) - 10, math.log(d) + 10
    while f(hi) > 0:
        hi += 5
    while f(lo) < 0:
        lo -= 5
    from scipy.optimize import brentq  # here: see calibrate_sigma

    s = math.exp(brentq(f, lo, hi, xtol=rtol / 4))
    while analytic_gaussian_delta(s, eps, d) > delta:
        s *= 1 + rtol
    return s
