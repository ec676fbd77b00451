"""The server's aggregators (sum, mean, data-size-weighted mean) and every rule by name, the robust rules of
`dpfl.schemes.robust` included."""

from __future__ import annotations

from typing import Any

import torch

from dpfl.errors import ConfigError
from dpfl.schemes.base import Aggregator, Received, RoundContext
from dpfl.schemes.robust import RULES


class SumAggregator(Aggregator):
    name = "sum"

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        return rec.total.to(torch.float32)


class MeanAggregator(Aggregator):
    """Unweighted mean 1/|K| Σ (DP schemes, FL-CS, FL-TOP)."""

    name = "mean"

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        return (rec.total.to(torch.float64) / max(1, rec.count)).to(torch.float32)


class WeightedMeanAggregator(Aggregator):
    """Σ |D_k|/Σ|D_j| Δw_k (FL-STD, FedAvg)."""

    name = "weighted_mean"
    needs_rows = True

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        if rec.rows is None:
            w = ctx.weights
            if torch.all(w == w[0]):
                return (rec.total.to(torch.float64) / max(1, rec.count)).to(torch.float32)
            raise ConfigError("a data-size-weighted mean needs individual updates; with secure aggregation "
                              "use the unweighted mean (clients can pre-scale their updates)")
        w = ctx.weights.to(rec.rows.dtype)
        return (w / w.sum()) @ rec.rows


AGGREGATORS: dict[str, type[Aggregator]] = {
    "sum": SumAggregator,
    "mean": MeanAggregator,
    "weighted_mean": WeightedMeanAggregator,
    **RULES,
}


def build_aggregator(name: str, options: dict[str, Any], env: dict[str, Any] | None = None) -> Aggregator:
    if name not in AGGREGATORS:
        raise ConfigError(f"unknown aggregator {name!r}; allowed: {', '.join(sorted(AGGREGATORS))}")
    try:
        return AGGREGATORS[name](**options)
    except TypeError as e:
        raise ConfigError(f"aggregator {name!r}: {e}") from None
