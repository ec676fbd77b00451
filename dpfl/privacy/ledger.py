"""The privacy ledger: events composed under one accountant, queried as eps(delta) / delta(eps).

Backends:
- ``moments``: thesis / Abadi moments accountant (integer lam = 1..32, classic tail bound);
- ``rdp``: Renyi DP on a fine order grid, improved RDP -> (eps, delta) conversion;
- ``pld``: privacy-loss distributions, dp-accounting's algorithm (``dpfl.privacy.pld``; the Gaussian
  and subsampled Gaussian in numpy, other leaves built by dp-accounting), composed incrementally.
Approximate-DP events are composed basically with the rest under moments/rdp (their
(eps_i, delta_i) add up); under pld they enter the PLD directly. Sampler total-variation
errors (``DiscreteGaussianEvent.sampler_tv``) add (1 + e^eps) x their sum to delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpfl.errors import BudgetExceededError, PrivacyError
from dpfl.privacy import rdp as R
from dpfl.privacy.events import (
    ApproxDPEvent,
    ComposedEvent,
    DiscreteGaussianEvent,
    Event,
    GaussianEvent,
    LaplaceEvent,
    PureDPEvent,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    SelfComposedEvent,
    ZCDPEvent,
    check_count,
    check_delta,
    check_epsilon,
    check_neighbouring,
    event_from_dict,
    flatten,
)

ACCOUNTANTS = ("moments", "rdp", "pld")
# which samplings (events.SAMPLINGS) each accountant can account for the Gaussian mechanism
SUPPORTED_SAMPLINGS = {
    "moments": ("poisson", "without-replacement"),
    "rdp": ("poisson", "without-replacement"),
    "pld": ("poisson",),
}


def check_accountant(name: str) -> str:
    if name not in ACCOUNTANTS:
        raise PrivacyError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")
    return name


@dataclass(frozen=True)
class Budget:
    """A total (epsilon, delta) that the ledger must not exceed."""

    epsilon: float
    delta: float

    def __post_init__(self):
        check_epsilon(self.epsilon, "budget epsilon")
        check_delta(self.delta, "budget delta")


# ---- backends: pure functions on a small state --------------------------------------------


class _RdpBackend:
    """State: (rdp curve, eps of approx-DP events, delta of approx-DP events)."""

    def __init__(self, orders: np.ndarray, classic: bool, neighbouring: str):
        self.orders, self.classic, self.neighbouring = orders, classic, neighbouring
        self._cache: dict[Event, np.ndarray] = {}

    def empty(self):
        return (np.zeros(self.orders.size), 0.0, 0.0)

    def _curve(self, leaf: Event) -> np.ndarray:
        c = self._cache.get(leaf)
        if c is None:
            c = R.leaf_rdp(leaf, self.orders, self.neighbouring)
            c.setflags(write=False)
            self._cache[leaf] = c
        return c

    def add(self, state, leaves: list[tuple[Event, int]]):
        curve, eps_a, delta_a = state
        for leaf, k in leaves:
            if isinstance(leaf, ApproxDPEvent):
                eps_a, delta_a = eps_a + k * leaf.epsilon, delta_a + k * leaf.delta
            else:
                curve = curve + (self._curve(leaf) if k == 1 else k * self._curve(leaf))
        return (curve, eps_a, delta_a)

    def epsilon(self, state, delta: float) -> float:
        curve, eps_a, delta_a = state
        if delta <= delta_a:
            return math.inf
        conv = R.epsilon_from_moments if self.classic else R.epsilon_from_rdp
        return conv(self.orders, curve, delta - delta_a)[0] + eps_a

    def delta(self, state, epsilon: float) -> float:
        curve, eps_a, delta_a = state
        if epsilon < eps_a:
            return 1.0
        conv = R.delta_from_moments if self.classic else R.delta_from_rdp
        return min(1.0, conv(self.orders, curve, epsilon - eps_a)[0] + delta_a)


class _PldBackend:
    """State: a ``dpfl.privacy.pld.Pld`` (dp-accounting's PLD algebra in numpy), or None while empty.

    The Gaussian and the Poisson-subsampled Gaussian under add/remove neighbours are built in numpy
    (``pld.gaussian``); every other leaf by dp-accounting, converted, so that only they import it."""

    def __init__(self, neighbouring: str, discretization: float):
        self.replace = neighbouring == "replace_one"
        self.dx = discretization
        self._cache: dict[tuple[Event, int], Any] = {}

    def empty(self):
        return None

    def _leaf_pld(self, leaf: Event):
        from dpfl.privacy import pld

        if isinstance(leaf, (GaussianEvent, SampledGaussianEvent)) and not self.replace:
            return pld.gaussian(leaf.noise_multiplier, getattr(leaf, "q", 1.0), self.dx)
        if isinstance(leaf, SampledWithoutReplacementGaussianEvent):
            raise PrivacyError(
                "the pld accountant cannot account sampling without replacement (dp-accounting's "
                "PLD accountant has no SampledWithoutReplacementDpEvent); use accountant='rdp' or "
                "'moments', or account the round as Poisson sampling"
            )
        if isinstance(leaf, DiscreteGaussianEvent):
            raise PrivacyError(
                "the thesis discrete-Gaussian bound (Thm 2-3) is a log-moment bound; "
                "account DiscreteGaussianEvent with accountant='rdp' or 'moments'"
            )
        if isinstance(leaf, ZCDPEvent):
            raise PrivacyError("zCDP events have no PLD; use accountant='rdp' or 'moments'")
        if not isinstance(leaf, (GaussianEvent, SampledGaussianEvent, LaplaceEvent, PureDPEvent, ApproxDPEvent)):
            raise PrivacyError(f"no PLD for event {type(leaf).__name__}")
        return pld.from_dp_accounting(self._dp_accounting_pld(leaf))

    def _dp_accounting_pld(self, leaf: Event):
        # here: importing dp-accounting takes over 1 s (scipy.stats, scipy.signal); only these leaves need it
        from dp_accounting.pld import common
        from dp_accounting.pld import privacy_loss_distribution as P
        from dp_accounting.privacy_accountant import NeighboringRelation as rel

        dx = self.dx
        relation = rel.REPLACE_ONE if self.replace else rel.ADD_OR_REMOVE_ONE
        if isinstance(leaf, (GaussianEvent, SampledGaussianEvent)):
            return P.from_gaussian_mechanism(
                leaf.noise_multiplier,
                value_discretization_interval=dx,
                sampling_prob=getattr(leaf, "q", 1.0),
                neighboring_relation=relation,
            )
        if isinstance(leaf, LaplaceEvent):
            return P.from_laplace_mechanism(
                leaf.scale, sensitivity=2 if self.replace else 1, value_discretization_interval=dx
            )
        d = leaf.delta if isinstance(leaf, ApproxDPEvent) else 0.0
        return P.from_privacy_parameters(
            common.DifferentialPrivacyParameters(leaf.epsilon, d), value_discretization_interval=dx
        )

    def _pld(self, leaf: Event, count: int):
        key = (leaf, count)
        p = self._cache.get(key)
        if p is None:
            base = self._cache.get((leaf, 1))
            if base is None:
                base = self._cache[(leaf, 1)] = self._leaf_pld(leaf)
            p = base if count == 1 else base.self_compose(count)
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = p
        return p

    def add(self, state, leaves: list[tuple[Event, int]]):
        for leaf, k in leaves:
            p = self._pld(leaf, k)
            state = p if state is None else state.compose(p)
        return state

    def epsilon(self, state, delta: float) -> float:
        return 0.0 if state is None else max(0.0, float(state.epsilon(delta)))

    def delta(self, state, epsilon: float) -> float:
        return 0.0 if state is None else min(1.0, float(state.delta(epsilon)))


def _tv_of(event: Event, count: int) -> float:
    return sum(
        k * leaf.sampler_tv for leaf, k in flatten(event, count) if isinstance(leaf, DiscreteGaussianEvent)
    )


# ---- the ledger ------------------------------------------------------------------------------


class Ledger:
    """Composes privacy events; refuses an event that would exceed the budget.

    ``Ledger(accountant="rdp", neighbouring="add_remove", budget=Budget(1.0, 1e-5))``.
    """

    def __init__(
        self,
        accountant: str = "rdp",
        neighbouring: str = "add_remove",
        budget: Budget | None = None,
        *,
        orders=None,
        pld_discretization: float = 1e-4,
    ):
        self.accountant = check_accountant(accountant)
        self.neighbouring = check_neighbouring(neighbouring)
        if budget is not None and not isinstance(budget, Budget):
            raise PrivacyError(f"budget must be a Budget or None, got {type(budget).__name__}")
        self.budget = budget
        if orders is not None and accountant != "rdp":
            raise PrivacyError("orders can only be set for accountant='rdp' (moments uses lam = 1..32)")
        if not (isinstance(pld_discretization, float) and 0 < pld_discretization <= 0.1):
            raise PrivacyError(f"pld_discretization must be a float in (0, 0.1], got {pld_discretization!r}")
        self.orders = None if orders is None else R.check_orders(orders)
        self.pld_discretization = pld_discretization
        if accountant == "pld":
            self._backend: Any = _PldBackend(self.neighbouring, pld_discretization)
        elif accountant == "moments":
            self._backend = _RdpBackend(R.MOMENTS_ORDERS, True, self.neighbouring)
        else:
            self._backend = _RdpBackend(
                R.DEFAULT_ORDERS if self.orders is None else self.orders, False, self.neighbouring
            )
        self._reset()

    def _reset(self):
        self._state = self._backend.empty()
        self._tv = 0.0
        self._events: list[tuple[Event, int]] = []
        self._eps_cache: dict[float, float] = {}

    # -- composition --

    def _tentative(self, event: Event, count: int):
        if not isinstance(event, Event):
            raise PrivacyError(f"expected a privacy Event, got {type(event).__name__}")
        check_count(count)
        leaves = (
            list(flatten(event, count))
            if isinstance(event, (SelfComposedEvent, ComposedEvent))
            else [(event, count)]
        )
        tv = sum(k * e.sampler_tv for e, k in leaves if isinstance(e, DiscreteGaussianEvent))
        return self._backend.add(self._state, leaves), self._tv + tv

    def _eps(self, state, tv: float, delta: float) -> float:
        eps = self._backend.epsilon(state, delta - 2 * tv) if delta > 2 * tv else math.inf
        if tv == 0 or not math.isfinite(eps):
            return eps
        for _ in range(100):  # increasing fixed point: delta_mech(eps) + (1 + e^eps) tv <= delta
            d = delta - (1 + math.exp(min(eps, 700))) * tv
            new = self._backend.epsilon(state, d) if d > 0 else math.inf
            if new <= eps:
                return eps
            eps = new
        return math.inf  # no certified epsilon found

    def would_exceed(self, event: Event, count: int = 1) -> bool:
        """True if adding ``event`` ``count`` times would exceed the budget (False without one)."""
        state, tv = self._tentative(event, count)
        return self.budget is not None and self._eps(state, tv, self.budget.delta) > self.budget.epsilon

    def add(self, event: Event, count: int = 1) -> None:
        """Record ``event`` ``count`` times; BudgetExceededError (nothing recorded) if over budget."""
        state, tv = self._tentative(event, count)
        if self.budget is not None:
            eps = self._eps(state, tv, self.budget.delta)
            if eps > self.budget.epsilon:
                raise BudgetExceededError(
                    f"adding {event!r} x{count} would reach epsilon={eps:.6g} > budget "
                    f"epsilon={self.budget.epsilon} at delta={self.budget.delta} ({self.accountant}); not recorded"
                )
        self._state, self._tv = state, tv
        self._events.append((event, count))
        self._eps_cache = {}

    # -- queries --

    def epsilon(self, delta: float | None = None) -> float:
        """Smallest epsilon this ledger certifies at ``delta`` (default: the budget's delta)."""
        if delta is None:
            if self.budget is None:
                raise PrivacyError("epsilon() needs delta when the ledger has no budget")
            delta = self.budget.delta
        delta = check_delta(delta)
        if delta not in self._eps_cache:
            self._eps_cache[delta] = self._eps(self._state, self._tv, delta)
        return self._eps_cache[delta]

    def delta(self, epsilon: float) -> float:
        """Smallest delta this ledger certifies at ``epsilon``."""
        epsilon = check_epsilon(epsilon)
        tv_term = (1 + math.exp(min(epsilon, 700))) * self._tv
        return min(1.0, self._backend.delta(self._state, epsilon) + tv_term)

    @property
    def events(self) -> list[tuple[Event, int]]:
        return list(self._events)

    @property
    def sampler_tv(self) -> float:
        return self._tv

    # -- checkpoint / resume --

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "accountant": self.accountant,
            "neighbouring": self.neighbouring,
            "budget": None
            if self.budget is None
            else {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "orders": None if self.orders is None else self.orders.tolist(),
            "pld_discretization": self.pld_discretization,
            "events": [{"event": e.to_dict(), "count": c} for e, c in self._events],
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> Ledger:
        b = d.get("budget")
        led = cls(
            d["accountant"],
            d["neighbouring"],
            None if b is None else Budget(b["epsilon"], b["delta"]),
            orders=d.get("orders"),
            pld_discretization=d.get("pld_discretization", 1e-4),
        )
        led.load_state_dict(d)
        return led

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Replay the recorded events in order (same floating-point path: same numbers)."""
        if d.get("version") != 1:
            raise PrivacyError(f"unsupported ledger state version {d.get('version')!r}")
        for key in ("accountant", "neighbouring"):
            if d[key] != getattr(self, key):
                raise PrivacyError(
                    f"ledger state has {key}={d[key]!r}, this ledger has {getattr(self, key)!r}"
                )
        self._reset()
        for item in d["events"]:
            event, count = event_from_dict(item["event"]), int(item["count"])
            self._state, self._tv = self._tentative(event, count)
            self._events.append((event, count))

    def __repr__(self) -> str:
        n = sum(c for _, c in self._events)
        return f"Ledger({self.accountant!r}, {self.neighbouring!r}, budget={self.budget}, events={n})"
