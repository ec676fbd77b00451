"""Privacy events: what one mechanism invocation costs, as a frozen, JSON-able value.

Noise parameters are relative to the bound on one unit's contribution (one record or one
client, the "sensitivity" C). Under ``add_remove`` neighbouring the outputs of neighbouring
datasets differ by at most C; under ``replace_one`` by at most 2C (the backends account for
that). Pure/approximate/zCDP events state a guarantee that already holds under the ledger's
neighbouring relation. A subsampled Gaussian is Poisson sampling (``SampledGaussianEvent``:
add_remove; replace_one under pld only) or sampling without replacement
(``SampledWithoutReplacementGaussianEvent``: replace_one, rdp/moments only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from dpfl.errors import PrivacyError

NEIGHBOURING = ("add_remove", "replace_one")
# how the units of one invocation are drawn: each independently with probability q (add/remove
# neighbours), or a uniformly random subset of fixed size m of n (replace-one neighbours, n public)
SAMPLINGS = ("poisson", "without-replacement")


def check_neighbouring(neighbouring: str) -> str:
    if neighbouring not in NEIGHBOURING:
        raise PrivacyError(f"neighbouring must be one of {NEIGHBOURING}, got {neighbouring!r}")
    return neighbouring


def _positive(name: str, value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise PrivacyError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _nonneg(name: str, value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise PrivacyError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_sampling(sampling: str) -> str:
    if sampling not in SAMPLINGS:
        raise PrivacyError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    return sampling


def sampling_neighbouring(sampling: str) -> str:
    """The neighbouring relation an epsilon for this sampling is stated under (dp-accounting's)."""
    return "replace_one" if check_sampling(sampling) == "without-replacement" else "add_remove"


def check_q(q: float) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not (0 < q <= 1):
        raise PrivacyError(f"sampling probability q must be in (0, 1], got {q!r}")
    return float(q)


def check_delta(delta: float, name: str = "delta") -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (0 < delta < 1):
        raise PrivacyError(f"{name} must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    return _nonneg(name, epsilon)


def check_count(count: int, name: str = "count") -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PrivacyError(f"{name} must be an integer >= 1, got {count!r}")
    return count


class Event:
    """Base class: every event is a frozen dataclass with a ``kind`` tag."""

    kind = "event"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, Event):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = [e.to_dict() for e in v]
            d[f.name] = v
        return d


@dataclass(frozen=True)
class GaussianEvent(Event):
    """Gaussian noise with std ``noise_multiplier`` x sensitivity (L2)."""

    noise_multiplier: float
    kind = "gaussian"

    def __post_init__(self):
        object.__setattr__(
            self, "noise_multiplier", _positive("noise_multiplier (sigma)", self.noise_multiplier)
        )


@dataclass(frozen=True)
class SampledGaussianEvent(Event):
    """Poisson subsampling with probability q, then the Gaussian mechanism."""

    noise_multiplier: float
    q: float
    kind = "sampled_gaussian"

    def __post_init__(self):
        object.__setattr__(
            self, "noise_multiplier", _positive("noise_multiplier (sigma)", self.noise_multiplier)
        )
        object.__setattr__(self, "q", check_q(self.q))


@dataclass(frozen=True)
class SampledWithoutReplacementGaussianEvent(Event):
    """A uniformly random subset of exactly ``sample`` of ``population`` units, then the Gaussian
    mechanism (dp-accounting's SampledWithoutReplacementDpEvent of a GaussianDpEvent).

    Accounted only under ``replace_one`` neighbours (the population size is public; Wang, Balle,
    Kasiviswanathan 2019, Thm 27), where the sensitivity is 2C: dp-accounting's noise multiplier
    is ``noise_multiplier / 2``.
    """

    noise_multiplier: float
    population: int
    sample: int
    kind = "sampled_wor_gaussian"

    def __post_init__(self):
        object.__setattr__(
            self, "noise_multiplier", _positive("noise_multiplier (sigma)", self.noise_multiplier)
        )
        check_count(self.population, "population (units sampled from)")
        check_count(self.sample, "sample (units drawn without replacement)")
        if self.sample > self.population:
            raise PrivacyError(f"sample = {self.sample} exceeds population = {self.population}")

    @property
    def q(self) -> float:
        return self.sample / self.population


def subsampled_gaussian(noise_multiplier: float, sampling: str, population: int, sample: int) -> Event:
    """One round that draws ``sample`` of ``population`` units (Poisson: each with probability
    q = sample / population) and adds Gaussian noise."""
    if check_sampling(sampling) == "poisson":
        return SampledGaussianEvent(noise_multiplier, sample / population)
    return SampledWithoutReplacementGaussianEvent(noise_multiplier, population, sample)


def kappa(xi: float) -> float:
    """Lemma 1 of the thesis: kappa(xi) = 2 e^{-2 pi^2 xi^2} / (1 - e^{-6 pi^2 xi^2})."""
    xi = _positive("xi", xi)
    return 2.0 * math.exp(-2 * math.pi**2 * xi**2) / -math.expm1(-6 * math.pi**2 * xi**2)


@dataclass(frozen=True)
class DiscreteGaussianEvent(Event):
    """The thesis discrete Gaussian mechanism (FL-SIGN-DP, Theorems 2-3).

    ``cohort`` clients each add DG(mu_k, sqrt(n) sigma / sqrt(cohort)) to an n-dimensional
    integer vector with L2 sensitivity sqrt(n); the sum carries std xi = sqrt(n) sigma.
    The log-moment of the subsampled Gaussian gets the correction
    log[(1+kappa(xi))^lam / (1-kappa(xi))^(lam+1) * ((1+nu)/(1-nu))^3]; the nu factor
    (sum of discrete Gaussians, Lemma 3) applies when cohort > 1 and needs
    xi / sqrt(cohort) >= sqrt(ln(2 + 2/nu)) / pi. ``nu=None`` takes the smallest valid nu.
    ``sampler_tv``: total-variation distance of the actual sampler outputs from exact
    discrete Gaussians for this invocation (see ``samplers.sampler_tv_bound``); the ledger
    adds (1 + e^eps) x its sum to delta.
    """

    noise_multiplier: float
    q: float
    n: int
    cohort: int
    nu: float | None = None
    sampler_tv: float = 0.0
    kind = "discrete_gaussian"

    def __post_init__(self):
        object.__setattr__(
            self, "noise_multiplier", _positive("noise_multiplier (sigma)", self.noise_multiplier)
        )
        object.__setattr__(self, "q", check_q(self.q))
        check_count(self.n, "n (number of coordinates)")
        check_count(self.cohort, "cohort (clients adding noise shares)")
        object.__setattr__(self, "sampler_tv", _nonneg("sampler_tv", self.sampler_tv))
        if not self.sampler_tv < 1:
            raise PrivacyError(f"sampler_tv must be < 1, got {self.sampler_tv}")
        k = kappa(self.xi)
        if not k < 1:
            raise PrivacyError(
                f"kappa(xi={self.xi:.4g}) = {k:.3g} >= 1: Lemma 1 needs a larger sqrt(n)*sigma"
            )
        if self.nu is not None:
            nu = _positive("nu", self.nu)
            if not nu < 1:
                raise PrivacyError(f"nu must be in (0, 1), got {nu}")
            object.__setattr__(self, "nu", nu)
            if self.cohort > 1 and self.xi_share < math.sqrt(math.log(2 + 2 / nu)) / math.pi:
                need = math.sqrt(self.cohort * math.log(2 + 2 / nu) / (self.n * math.pi**2))
                raise PrivacyError(
                    f"Lemma 3 needs sigma >= sqrt(cohort ln(2+2/nu) / (n pi^2)) = {need:.4g} for nu={nu}, "
                    f"got sigma={self.noise_multiplier}; raise sigma or nu"
                )
        elif self.cohort > 1 and self.nu_effective >= 1:
            raise PrivacyError(
                f"per-client share std {self.xi_share:.4g} is below sqrt(ln 4)/pi = 0.375: no nu < 1 "
                "satisfies Lemma 3; raise sigma"
            )

    @property
    def xi(self) -> float:
        """Std of the summed noise on the integer lattice: sqrt(n) * sigma."""
        return math.sqrt(self.n) * self.noise_multiplier

    @property
    def xi_share(self) -> float:
        """Std of one client's share: xi / sqrt(cohort)."""
        return self.xi / math.sqrt(self.cohort)

    @property
    def nu_effective(self) -> float:
        """The nu used in the bound (0 when cohort == 1: a single DG needs no Lemma 3)."""
        if self.cohort == 1:
            return 0.0
        if self.nu is not None:
            return self.nu
        # smallest nu with pi^2 xi_share^2 >= ln(2 + 2/nu): nu = 2/(e^x - 2) = 1/expm1(x - ln 2),
        # nudged up against rounding (a larger nu is always valid and more conservative)
        x = math.pi**2 * self.xi_share**2
        if x <= math.log(4):
            return 1.0
        if x > 700:
            return 0.0
        return (1 + 1e-12) / math.expm1(x - math.log(2))

    def log_moment_correction(self, lam):
        """Thesis Thm 3 correction added to alpha(lam) per invocation (lam may be an array)."""
        k = kappa(self.xi)
        nu = self.nu_effective
        c_nu = 3.0 * (math.log1p(nu) - math.log1p(-nu)) if nu > 0 else 0.0
        return lam * math.log1p(k) - (lam + 1) * math.log1p(-k) + c_nu


@dataclass(frozen=True)
class LaplaceEvent(Event):
    """Laplace noise with scale ``scale`` x sensitivity (L1): (1/scale)-DP."""

    scale: float
    kind = "laplace"

    def __post_init__(self):
        object.__setattr__(self, "scale", _positive("scale", self.scale))


@dataclass(frozen=True)
class PureDPEvent(Event):
    """Any epsilon-DP mechanism."""

    epsilon: float
    kind = "pure_dp"

    def __post_init__(self):
        object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))


@dataclass(frozen=True)
class ApproxDPEvent(Event):
    """Any (epsilon, delta)-DP mechanism (composed basically with the rest)."""

    epsilon: float
    delta: float
    kind = "approx_dp"

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta))


@dataclass(frozen=True)
class ZCDPEvent(Event):
    """A (xi, rho)-zCDP mechanism: D_alpha <= xi + rho * alpha for all alpha > 1."""

    rho: float
    xi: float = 0.0
    kind = "zcdp"

    def __post_init__(self):
        object.__setattr__(self, "rho", _positive("rho", self.rho))
        object.__setattr__(self, "xi", _nonneg("xi", self.xi))


@dataclass(frozen=True)
class SelfComposedEvent(Event):
    event: Event
    count: int
    kind = "self_composed"

    def __post_init__(self):
        if not isinstance(self.event, Event):
            raise PrivacyError(f"SelfComposedEvent.event must be an Event, got {type(self.event).__name__}")
        check_count(self.count)


@dataclass(frozen=True)
class ComposedEvent(Event):
    events: tuple
    kind = "composed"

    def __post_init__(self):
        evs = tuple(self.events)
        if not evs or not all(isinstance(e, Event) for e in evs):
            raise PrivacyError("ComposedEvent.events must be a non-empty sequence of Events")
        object.__setattr__(self, "events", evs)


_KINDS = {
    c.kind: c
    for c in (
        GaussianEvent,
        SampledGaussianEvent,
        SampledWithoutReplacementGaussianEvent,
        DiscreteGaussianEvent,
        LaplaceEvent,
        PureDPEvent,
        ApproxDPEvent,
        ZCDPEvent,
        SelfComposedEvent,
        ComposedEvent,
    )
}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_dict``."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in _KINDS:
        raise PrivacyError(f"unknown event kind {kind!r}; known: {sorted(_KINDS)}")
    if kind == "self_composed":
        return SelfComposedEvent(event_from_dict(d["event"]), d["count"])
    if kind == "composed":
        return ComposedEvent(tuple(event_from_dict(e) for e in d["events"]))
    return _KINDS[kind](**d)


def flatten(event: Event, count: int = 1):
    """Yield (leaf event, count) pairs of a possibly nested event."""
    if isinstance(event, SelfComposedEvent):
        yield from flatten(event.event, count * event.count)
    elif isinstance(event, ComposedEvent):
        for e in event.events:
            yield from flatten(e, count)
    else:
        yield event, count
