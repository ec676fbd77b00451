"""The bandwidth-efficient schemes of thesis ch. 4 (Algorithms 3–8), registered by name.

    fl-sign    sign                                  | Σ (1-bit rows) → γ·sign       (Alg. 3)
    signsgd    sign, 1 mini-batch, all clients       | Σ → γ·sign, 1-bit downstream
    fl-cs      DCT compress (P chunks, shared perm.) | mean → momentum, error feedback, BPDN  (Alg. 4)
    fl-rnd     shared random m-subset, new per round | weighted mean → scatter  (Alg. 5)
    fl-freq    first m DCT coefficients              | weighted mean → inverse DCT (low-pass)  (Alg. 6)
    fl-top     Top-K set from public data, Top-K SGD | mean → scatter; K values downstream  (Alg. 7–8)
    fl-basic   random trainable K-subset per round   | mean → scatter; full model downstream

Their -DP versions live in catalog_dp.py.
"""

from __future__ import annotations

from dpfl.compression.bits import SignCodec
from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import MeanAggregator, SumAggregator, WeightedMeanAggregator
from dpfl.schemes.cs import CompressiveSensingStep, LowPassDCTStep
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.sign import SignStep
from dpfl.schemes.subset import RandomSubsetStep
from dpfl.schemes.topk import TopKStep
from dpfl.schemes.transport import PlainTransport


def _ratio(name: str, ratio: float) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"scheme {name!r}: ratio must be in (0, 1], got {ratio!r}")
    return float(ratio)


@register("fl-sign")
def fl_sign(gamma: float = 0.001) -> Scheme:
    return Scheme("fl-sign", [SignStep(gamma)], PlainTransport(SignCodec()), SumAggregator())


@register("signsgd")
def signsgd(gamma: float = 0.001) -> Scheme:
    return Scheme("signsgd", [SignStep(gamma, one_bit_downstream=True)], PlainTransport(SignCodec()),
                  SumAggregator(), train_overrides={"steps": 1}, all_clients=True, streams=True)


@register("fl-cs")
def fl_cs(ratio: float = 0.05, chunks: int = 200, lam: float = 1e-5, server_lr: float = 0.35,
          momentum: float = 0.9, max_iter: int = 1000, tol: float = 3e-3) -> Scheme:
    step = CompressiveSensingStep(_ratio("fl-cs", ratio), chunks, lam, server_lr, momentum, max_iter, tol)
    return Scheme("fl-cs", [step], PlainTransport(), MeanAggregator())


@register("fl-rnd")
def fl_rnd(ratio: float = 0.05) -> Scheme:
    return Scheme("fl-rnd", [RandomSubsetStep(_ratio("fl-rnd", ratio))], PlainTransport(), WeightedMeanAggregator())


@register("fl-freq")
def fl_freq(ratio: float = 0.05, layout: str = "pytorch") -> Scheme:
    return Scheme("fl-freq", [LowPassDCTStep(_ratio("fl-freq", ratio), layout)], PlainTransport(),
                  WeightedMeanAggregator())


@register("fl-top")
def fl_top(ratio: float = 0.005, init_steps: int = 5, init_lr: float = 0.215, task: str = "multiclass") -> Scheme:
    return Scheme("fl-top", [TopKStep(_ratio("fl-top", ratio), init_steps, init_lr, task)], PlainTransport(),
                  MeanAggregator())


@register("fl-basic")
def fl_basic(ratio: float = 0.005) -> Scheme:
    return Scheme("fl-basic", [RandomSubsetStep(_ratio("fl-basic", ratio), mask_training=True)], PlainTransport(),
                  MeanAggregator())
