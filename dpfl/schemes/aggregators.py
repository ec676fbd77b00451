"""Aggregators by name (robust rules register here from dpfl.attacks.robust)."""

from __future__ import annotations

from typing import Any

from dpfl.errors import ConfigError
from dpfl.schemes.base import Aggregator
from dpfl.schemes.transport import MeanAggregator, SumAggregator, WeightedMeanAggregator

AGGREGATORS: dict[str, type[Aggregator]] = {
    "sum": SumAggregator,
    "mean": MeanAggregator,
    "weighted_mean": WeightedMeanAggregator,
}


def build_aggregator(name: str, options: dict[str, Any], env: dict[str, Any] | None = None) -> Aggregator:
    try:
        import dpfl.attacks.robust  # noqa: F401  (registers robust rules)
    except ImportError:
        pass
    if name not in AGGREGATORS:
        raise ConfigError(f"unknown aggregator {name!r}; allowed: {', '.join(sorted(AGGREGATORS))}")
    try:
        return AGGREGATORS[name](**options)
    except TypeError as e:
        raise ConfigError(f"aggregator {name!r}: {e}") from None
