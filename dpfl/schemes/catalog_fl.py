"""The survey's FL variants (notes §1.6–1.9), registered by name. See docs/fl-variants.md.

    fedprox     FL-STD + proximal term μ/2‖w − w_t‖² in local training      | weighted mean
    fsvrg       full gradient at round start, one SVRG pass, h_k = h/n_k       | weighted mean
    feddyn      stateful clients (gradient memory), dynamic regulariser α      | mean → h correction
    sub-fedavg  personal masks by magnitude pruning                            | mean on the intersection
"""

from __future__ import annotations

import math
from typing import Any

from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import MeanAggregator, SumAggregator, WeightedMeanAggregator
from dpfl.schemes.client_state import state_dtype as parse_state_dtype
from dpfl.schemes.feddyn import FedDynStep
from dpfl.schemes.fsvrg import FSVRGStep
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.subfedavg import SubFedAvgStep
from dpfl.schemes.transport import PlainTransport


def _number(scheme: str, name: str, v: Any, lo: float, hi: float = math.inf, lo_open: bool = False,
            hi_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ConfigError(f"scheme {scheme!r}: {name} must be a number in {rng}, got {v!r}")
    return float(v)


def _integer(scheme: str, name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"scheme {scheme!r}: {name} must be an integer ≥ {lo}, got {v!r}")
    return v


def _check_prox_stability(scheme: str, name: str, value: float, train: Any) -> None:
    """Local SGD on a μ/2‖w − w_t‖² term contracts only while lr·μ < 2."""
    if train is not None and getattr(train, "optimizer", "sgd") == "sgd" and train.lr * value >= 2:
        raise ConfigError(f"scheme {scheme!r}: {name} = {value} with train.lr = {train.lr} gives lr·{name} ≥ 2, "
                          f"so local SGD diverges on the proximal term; use {name} < {2 / train.lr:.4g}")


@register("fedprox")
def fedprox(mu: float = 0.01, train: Any = None) -> Scheme:
    mu = _number("fedprox", "mu", mu, 0)
    _check_prox_stability("fedprox", "mu", mu, train)
    return Scheme("fedprox", [], PlainTransport(), WeightedMeanAggregator(), train_overrides={"prox_mu": mu})


@register("fsvrg")
def fsvrg(h: float = 1.0, batch_size: int = 1) -> Scheme:
    h = _number("fsvrg", "h", h, 0, lo_open=True)
    batch_size = _integer("fsvrg", "batch_size", batch_size, 1)
    return Scheme("fsvrg", [FSVRGStep(h, batch_size)], PlainTransport(), WeightedMeanAggregator(),
                  train_overrides={"lr": h, "optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0,
                                   "prox_mu": 0.0, "batch_size": batch_size}, one_pass=True)


@register("feddyn")
def feddyn(alpha: float = 0.01, state_dtype: str = "float32", train: Any = None) -> Scheme:
    alpha = _number("feddyn", "alpha", alpha, 0, lo_open=True)
    _check_prox_stability("feddyn", "alpha", alpha, train)
    dtype = parse_state_dtype("feddyn", state_dtype)
    return Scheme("feddyn", [FedDynStep(alpha, dtype)], PlainTransport(), MeanAggregator(),
                  train_overrides={"prox_mu": alpha})


@register("sub-fedavg")
def sub_fedavg(sparsity: float = 0.5, prune_rate: float = 0.2, personal_eval: int = 500) -> Scheme:
    sparsity = _number("sub-fedavg", "sparsity", sparsity, 0, 1, hi_open=True)
    prune_rate = _number("sub-fedavg", "prune_rate", prune_rate, 0, 1, lo_open=True)
    personal_eval = _integer("sub-fedavg", "personal_eval", personal_eval, 0)
    return Scheme("sub-fedavg", [SubFedAvgStep(sparsity, prune_rate, personal_eval)], PlainTransport(),
                  SumAggregator())
