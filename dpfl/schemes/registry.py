"""Named schemes: each is a chain of steps, a transport and an aggregator."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpfl.errors import ConfigError
from dpfl.schemes.base import Aggregator, RoundContext, SetupContext, Step, Transport
from dpfl.schemes.std import ServerLR
from dpfl.schemes.transport import PlainTransport, WeightedMeanAggregator


@dataclass
class Scheme:
    name: str
    steps: list[Step]
    transport: Transport
    aggregator: Aggregator
    # local-training overrides (e.g. FedSGD: one full-batch step with lr 1)
    train_overrides: dict[str, Any] = field(default_factory=dict)
    full_batch: bool = False  # one batch = all of a client's data
    all_clients: bool = False  # every client every round (signSGD)

    def setup(self, ctx: SetupContext) -> None:
        for s in self.steps:
            s.setup(ctx)
        self.transport.setup(ctx)
        if self.aggregator.needs_rows and self.transport.secure:
            raise ConfigError(f"scheme {self.name}: aggregator {self.aggregator.name!r} needs individual updates, "
                              "which secure aggregation hides from the server; use a mean or sum aggregator")

    def downstream_bytes(self, ctx: RoundContext) -> int:
        for s in self.steps:
            b = s.downstream_bytes(ctx)
            if b is not None:
                return int(b)
        return 4 * ctx.n_params

    def describe(self) -> str:
        chain = " → ".join(s.describe() for s in self.steps) or "(identity)"
        return f"{self.name}: {chain} | {self.transport.name} | {self.aggregator.name}"

    def state_dict(self) -> dict:
        return {"steps": [s.state_dict() for s in self.steps], "transport": self.transport.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for s, st in zip(self.steps, state["steps"]):
            s.load_state_dict(st)
        self.transport.load_state_dict(state["transport"])


Builder = Callable[..., Scheme]
_REGISTRY: dict[str, tuple[Builder, str]] = {}


def register(name: str, help: str = "") -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        _REGISTRY[name] = (fn, help)
        return fn

    return deco


def list_schemes() -> dict[str, str]:
    _load_all()
    return {k: v[1] for k, v in sorted(_REGISTRY.items())}


def build_scheme(name: str, options: dict[str, Any], env: dict[str, Any]) -> Scheme:
    """Build scheme `name`. `options` come from the config; `env` carries run facts
    (n_params, cohort_size, train config, ...) that builders may take as keyword arguments."""
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown scheme {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    fn = _REGISTRY[name][0]
    params = inspect.signature(fn).parameters
    env_keys = {k for k in params if k in env}
    allowed = [k for k in params if k not in env_keys and k != "env"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"scheme {name!r}: unknown option(s) {unknown}; allowed: {', '.join(allowed) or 'none'}")
    kwargs = {k: env[k] for k in env_keys}
    if "env" in params:
        kwargs["env"] = env
    try:
        return fn(**kwargs, **options)
    except TypeError as e:
        raise ConfigError(f"scheme {name!r}: {e}") from None


_LOADED = False


def _load_all() -> None:
    """Import the modules that register schemes (kept lazy so a broken optional module is named)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import importlib

    for mod in ("dpfl.schemes.catalog", "dpfl.schemes.catalog_dp", "dpfl.schemes.catalog_fl", "dpfl.schemes.catalog_qsgd"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


@register("fl-std", "FL-STD (thesis §2.1): local SGD, data-size-weighted mean of updates (FedAvg)")
def fl_std() -> Scheme:
    return Scheme("fl-std", [], PlainTransport(), WeightedMeanAggregator())


@register("fedavg", "FedAvg (McMahan et al.), same as fl-std")
def fedavg() -> Scheme:
    return Scheme("fedavg", [], PlainTransport(), WeightedMeanAggregator())


@register("fedsgd", "FedSGD: one full-batch gradient per client, server step η·weighted mean")
def fedsgd(server_lr: float = 0.1) -> Scheme:
    if server_lr <= 0:
        raise ConfigError(f"scheme 'fedsgd': server_lr must be > 0, got {server_lr}")
    return Scheme("fedsgd", [ServerLR(server_lr)], PlainTransport(), WeightedMeanAggregator(),
                  train_overrides={"steps": 1, "lr": 1.0, "optimizer": "sgd", "momentum": 0.0}, full_batch=True)


