"""Named schemes: each is a chain of steps, a transport and an aggregator."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.compression.base import Float32Codec
from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import WeightedMeanAggregator
from dpfl.schemes.base import Aggregator, RoundContext, SetupContext, Step, Transport
from dpfl.schemes.index import SCHEMES, list_schemes  # noqa: F401  (list_schemes re-exported)
from dpfl.schemes.server_lr import ServerLRStep
from dpfl.schemes.transport import PlainTransport


@dataclass
class Scheme:
    name: str
    steps: list[Step]
    transport: Transport
    aggregator: Aggregator
    # local-training overrides (e.g. FedSGD: one full-batch step with lr 1)
    train_overrides: dict[str, Any] = field(default_factory=dict)
    full_batch: bool = False  # one batch = all of a client's data
    one_pass: bool = False  # one pass over each client's data: ⌈max_k n_k / B⌉ steps of B samples (FSVRG)
    all_clients: bool = False  # every client every round (signSGD)
    # its client steps and transport act on each client's row alone and it sums exact integers: with a
    # plain transport and an aggregator of the total, a round may go in pieces (run.max_cohort; signSGD)
    streams: bool = False
    # how the privacy events account client selection (DP schemes): "poisson" | "without-replacement" | "none"
    privacy_sampling: str | None = None

    @property
    def private(self) -> bool:
        """True when a step adds privacy events: the run keeps a privacy ledger."""
        return any(s.private for s in self.steps)

    @property
    def client_state(self) -> bool:
        """True when a step keeps per-client state between rounds (kept on a deployed client's node)."""
        return any(s.client_state for s in self.steps)

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
        return float32_nbytes(ctx.global_params)  # measured: the model payload each client downloads

    def describe(self) -> str:
        chain = " → ".join(s.describe() for s in self.steps) or "(identity)"
        return f"{self.name}: {chain} | {self.transport.name} | {self.aggregator.name}"

    def state_dict(self) -> dict:
        return {"steps": [s.state_dict() for s in self.steps], "transport": self.transport.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for s, st in zip(self.steps, state["steps"]):
            s.load_state_dict(st)
        self.transport.load_state_dict(state["transport"])


def float32_nbytes(values: torch.Tensor) -> int:
    """Bytes of the float32 payload that carries `values` to one client (measured, not 4·n)."""
    return int(Float32Codec().encode(values.reshape(1, -1)).per_client_nbytes()[0])


Builder = Callable[..., Scheme]
_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Register a builder under `name`, which dpfl/schemes/index.py must list with the builder's module."""

    def deco(fn: Builder) -> Builder:
        listed = SCHEMES.get(name, ("nothing",))[0]
        if listed != fn.__module__:
            raise ValueError(f"scheme {name!r} is built in {fn.__module__}, but dpfl/schemes/index.py lists "
                             f"{listed} for it: add or correct its entry there")
        _REGISTRY[name] = fn
        return fn

    return deco


def build_scheme(name: str, options: dict[str, Any], env: dict[str, Any]) -> Scheme:
    """Build scheme `name`. `options` come from the config; `env` carries run facts
    (n_params, cohort_size, train config, ...) that builders may take as keyword arguments."""
    if name not in SCHEMES:
        raise ConfigError(f"unknown scheme {name!r}; allowed: {', '.join(sorted(SCHEMES))}")
    importlib.import_module(SCHEMES[name][0])  # registers the schemes it builds
    fn = _REGISTRY[name]
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


@register("fl-std")
def fl_std() -> Scheme:
    return Scheme("fl-std", [], PlainTransport(), WeightedMeanAggregator())


@register("fedavg")
def fedavg() -> Scheme:
    return Scheme("fedavg", [], PlainTransport(), WeightedMeanAggregator())


@register("fedsgd")
def fedsgd(server_lr: float = 0.1) -> Scheme:
    if server_lr <= 0:
        raise ConfigError(f"scheme 'fedsgd': server_lr must be > 0, got {server_lr}")
    return Scheme("fedsgd", [ServerLRStep(server_lr)], PlainTransport(), WeightedMeanAggregator(),
                  train_overrides={"steps": 1, "lr": 1.0, "optimizer": "sgd", "momentum": 0.0}, full_batch=True)


