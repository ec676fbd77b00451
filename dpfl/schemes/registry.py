"""Named schemes: each is a chain of steps, a transport and an aggregator."""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.compression.base import Float32Codec
from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import MeanAggregator, WeightedMeanAggregator
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
        for s in self.steps:
            if s.needs_aggregator is not None and self.aggregator.name != s.needs_aggregator:
                raise ConfigError(f"scheme {self.name}: step {s.describe()} reads the {s.needs_aggregator!r} "
                                  f"aggregate, not {self.aggregator.name!r}; leave scheme.aggregator unset")
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
    refused = getattr(fn, "refused_options", {})  # options this scheme refuses with a reason of its own
    why = [refused[k] for k in sorted(set(options) & set(refused))]
    if why:
        raise ConfigError(f"scheme {name!r}: {why[0]}")
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


def _fedavg(name: str, secure: bool, clip: float | None, frac_bits: int | None, tolerate: int | None,
            cohort_size: int) -> Scheme:
    """FedAvg with plain float32 updates and the data-size-weighted mean, or (`secure = true`) the
    cross-silo form: each client clips its update to L2 norm `clip` (so every value is in ±clip, the
    fixed-point range), the updates reach the server only as a secure sum (`SecAggTransport`,
    fixed point at 2^-frac_bits, stochastic rounding), and the server takes the unweighted mean over
    the clients in the sum. No client-level noise: pair it with train.dpsgd for record-level DP.
    `tolerate` (l, default 0): clients that may drop after masking without aborting the round;
    `frac_bits` default 20."""
    if not isinstance(secure, bool):
        raise ConfigError(f"scheme {name!r}: secure must be true or false, got {secure!r}")
    if not secure:
        if clip is not None or frac_bits is not None or tolerate is not None:
            raise ConfigError(f"scheme {name!r}: clip, frac_bits and tolerate apply only with secure = true")
        return Scheme(name, [], PlainTransport(), WeightedMeanAggregator())
    from dpfl.schemes.dp import ClipStep
    from dpfl.schemes.secure_sum import SecAggTransport

    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0:
        raise ConfigError(f"scheme {name!r}: secure = true needs clip, the L2 bound on each update "
                          f"(a number > 0: it sets the fixed-point range), got {clip!r}")
    if frac_bits is not None and (isinstance(frac_bits, bool) or not isinstance(frac_bits, int)
                                  or not 0 <= frac_bits <= 52):
        raise ConfigError(f"scheme {name!r}: frac_bits must be an integer in [0, 52], got {frac_bits!r}")
    if tolerate is not None and (isinstance(tolerate, bool) or not isinstance(tolerate, int) or tolerate < 0):
        raise ConfigError(f"scheme {name!r}: tolerate must be an integer ≥ 0, got {tolerate!r}")
    frac_bits = 20 if frac_bits is None else frac_bits
    tolerate = 0 if tolerate is None else tolerate
    clip = float(clip)
    transport = SecAggTransport("fixed", clip_range=clip, frac_bits=frac_bits, max_dropouts=tolerate,
                                cohort=cohort_size if cohort_size >= 2 else None)
    # what a deployed client compares with the server's scheme names the encoding too
    transport.name = f"secagg(fixed, ±{clip:g}, 2^-{frac_bits}, l={tolerate})"
    return Scheme(name, [ClipStep(clip)], transport, MeanAggregator())


@register("fl-std")
def fl_std(secure: bool = False, clip: float | None = None, frac_bits: int | None = None,
           tolerate: int | None = None, cohort_size: int = 0) -> Scheme:
    return _fedavg("fl-std", secure, clip, frac_bits, tolerate, cohort_size)


@register("fedavg")
def fedavg(secure: bool = False, clip: float | None = None, frac_bits: int | None = None,
           tolerate: int | None = None, cohort_size: int = 0) -> Scheme:
    return _fedavg("fedavg", secure, clip, frac_bits, tolerate, cohort_size)


@register("fedsgd")
def fedsgd(server_lr: float = 0.1) -> Scheme:
    if server_lr <= 0:
        raise ConfigError(f"scheme 'fedsgd': server_lr must be > 0, got {server_lr}")
    return Scheme("fedsgd", [ServerLRStep(server_lr)], PlainTransport(), WeightedMeanAggregator(),
                  train_overrides={"steps": 1, "lr": 1.0, "optimizer": "sgd", "momentum": 0.0}, full_batch=True)


