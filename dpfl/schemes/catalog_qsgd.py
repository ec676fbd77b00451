"""QSGD and QSGD-DP, written only against the scheme contract (see docs/adding-a-scheme.md).

    qsgd     QSGD quantize (s levels, bucket B)          | weighted mean of the dequantized rows
    qsgd-dp  local:   clip → Gaussian noise → QSGD      | DP mean   (quantization is post-processing)
             central: clip → QSGD → (server) Gaussian noise on the mean, sensitivity (1 + √B/s)·S
"""

from __future__ import annotations

import math

from dpfl.compression.qsgd import QSGDCodec
from dpfl.errors import ConfigError
from dpfl.privacy import GaussianEvent
from dpfl.schemes.catalog_dp import _sigma_or_epsilon, calibrated_sigma
from dpfl.schemes.dp import Clip, DPMeanAggregator, GaussianNoise, PlainDP
from dpfl.schemes.qsgd import QSGDStep
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.transport import PlainTransport, WeightedMeanAggregator


@register("qsgd", "QSGD (Alistarh et al. 2017): stochastic s-level quantization per bucket, weighted mean")
def qsgd(levels: int = 15, bucket: int = 512) -> Scheme:
    return Scheme("qsgd", [QSGDStep(levels, bucket)], PlainTransport(QSGDCodec(levels, bucket)),
                  WeightedMeanAggregator())


@register("qsgd-dp", "QSGD-DP: clip, Gaussian noise (local, or central at a trusted server), QSGD on the wire")
def qsgd_dp(sampling_rate, rounds, privacy, levels: int = 15, bucket: int = 512, clip: float = 1.0,
            sigma: float | None = None, epsilon: float | None = None, noise: str = "local") -> Scheme:
    _sigma_or_epsilon("qsgd-dp", sigma, epsilon)
    if noise not in ("local", "central"):
        raise ConfigError(f"scheme 'qsgd-dp': noise must be 'local' or 'central', got {noise!r} "
                          "(distributed shares would be quantized before they sum: no Gaussian guarantee)")
    clip_step, quant = Clip(clip), QSGDStep(levels, bucket)
    # central: the server noises the mean of Q(clip(v)), and ‖Q(v)‖ ≤ (1 + √B/s)·‖v‖ (+ float margin)
    sens = clip_step if noise == "local" else Clip(clip * (1 + math.sqrt(bucket) / levels) * (1 + 1e-6))
    event = (lambda x: GaussianEvent(x / 2)) if noise == "local" else None
    sigma = sigma or calibrated_sigma(epsilon, privacy, sampling_rate, rounds, event)
    noise_step = GaussianNoise(sigma, sens, sampling_rate, 0, noise)
    chain = [clip_step, noise_step, quant] if noise == "local" else [clip_step, quant, noise_step]
    return Scheme("qsgd-dp", chain, PlainDP(QSGDCodec(levels, bucket)), DPMeanAggregator())
