"""Privacy core: events, the ledger and its accountants (moments, rdp, pld), calibration,
composition theorems, and mechanisms with exact samplers. See docs/privacy.md.

The names below are imported from their submodules on first use (PEP 562), so that importing one
submodule (``dpfl privacy epsilon`` imports the ledger and calibration) does not import the others
(the samplers and ``dpfl.rng``, the composition theorems)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_SOURCES = {
    "calibration": (
        "analytic_gaussian_delta",
        "analytic_gaussian_sigma",
        "calibrate_sigma",
        "calibrate_sigma_for_events",
        "classic_gaussian_sigma",
        "epsilon_for",
        "epsilon_without_replacement",
        "laplace_scale",
    ),
    "composition": (
        "TopDownPlan",
        "advanced_composition",
        "advanced_composition_improved",
        "amplify_by_sampling",
        "amplify_by_sampling_tight",
        "basic_composition",
        "cdp_to_zcdp",
        "dp_to_zcdp",
        "gaussian_zcdp",
        "plan_top_down",
        "pure_dp_to_zcdp",
        "zcdp_to_dp",
    ),
    "events": (
        "ApproxDPEvent",
        "ComposedEvent",
        "DiscreteGaussianEvent",
        "Event",
        "GaussianEvent",
        "LaplaceEvent",
        "PureDPEvent",
        "SampledGaussianEvent",
        "SampledWithoutReplacementGaussianEvent",
        "SelfComposedEvent",
        "ZCDPEvent",
        "event_from_dict",
        "kappa",
    ),
    "ledger": ("ACCOUNTANTS", "Budget", "Ledger"),
    "samplers": ("discrete_laplace_tv_bound", "sampler_tv_bound"),
}
_WHERE = {name: mod for mod, names in _SOURCES.items() for name in names}

if TYPE_CHECKING:
    from dpfl.privacy.calibration import (
        analytic_gaussian_delta,
        analytic_gaussian_sigma,
        calibrate_sigma,
        calibrate_sigma_for_events,
        classic_gaussian_sigma,
        epsilon_for,
        epsilon_without_replacement,
        laplace_scale,
    )
    from dpfl.privacy.composition import (
        TopDownPlan,
        advanced_composition,
        advanced_composition_improved,
        amplify_by_sampling,
        amplify_by_sampling_tight,
        basic_composition,
        cdp_to_zcdp,
        dp_to_zcdp,
        gaussian_zcdp,
        plan_top_down,
        pure_dp_to_zcdp,
        zcdp_to_dp,
    )
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
        event_from_dict,
        kappa,
    )
    from dpfl.privacy.ledger import ACCOUNTANTS, Budget, Ledger
    from dpfl.privacy.samplers import discrete_laplace_tv_bound, sampler_tv_bound


# the submodules that importing the package used to import (as attributes: ``dpfl.privacy.ledger``)
_SUBMODULES = ("calibration", "composition", "events", "ledger", "rdp", "samplers")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ACCOUNTANTS",
    "ApproxDPEvent",
    "Budget",
    "ComposedEvent",
    "DiscreteGaussianEvent",
    "Event",
    "GaussianEvent",
    "LaplaceEvent",
    "Ledger",
    "PureDPEvent",
    "SampledGaussianEvent",
    "SampledWithoutReplacementGaussianEvent",
    "SelfComposedEvent",
    "TopDownPlan",
    "ZCDPEvent",
    "advanced_composition",
    "advanced_composition_improved",
    "amplify_by_sampling",
    "amplify_by_sampling_tight",
    "analytic_gaussian_delta",
    "analytic_gaussian_sigma",
    "basic_composition",
    "calibrate_sigma",
    "calibrate_sigma_for_events",
    "cdp_to_zcdp",
    "classic_gaussian_sigma",
    "discrete_laplace_tv_bound",
    "dp_to_zcdp",
    "epsilon_for",
    "epsilon_without_replacement",
    "event_from_dict",
    "gaussian_zcdp",
    "kappa",
    "laplace_scale",
    "plan_top_down",
    "pure_dp_to_zcdp",
    "sampler_tv_bound",
    "zcdp_to_dp",
]
