"""QSGD and QSGD-DP, written only against the scheme contract (see docs/adding-a-scheme.md).

    qsgd     QSGD quantize (s levels, bucket B)          | weighted mean of the dequantized rows
    qsgd-dp  local:   clip → Gaussian noise → QSGD      | DP mean   (quantization is post-processing)
             central: clip → QSGD → (server) Gaussian noise on the mean, sensitivity (1 + √B/s)·S
"""

from __future__ import annotations

import math

from dpfl.compression.qsgd import QSGDCodec
from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import WeightedMeanAggregator
from dpfl.schemes.catalog_dp import _sigma_or_epsilon, calibrated_sigma, client_sampling
from dpfl.schemes.dp import Clip, DPMeanAggregator, GaussianNoise, PlainDP
from dpfl.schemes.qsgd import QSGDStep
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.transport import PlainTransport


@register("qsgd")
def qsgd(levels: int = 15, bucket: int = 512) -> Scheme:
    return Scheme("qsgd", [QSGDStep(levels, bucket)], PlainTransport(QSGDCodec(levels, bucket)),
                  WeightedMeanAggregator())


@register("qsgd-dp")
def qsgd_dp(cohort_size, n_clients, sampling, sampling_rate, rounds, privacy, levels: int = 15, bucket: int = 512,
            clip: float = 1.0, sigma: float | None = None, epsilon: float | None = None, noise: str = "local") -> Scheme:
    _sigma_or_epsilon("qsgd-dp", sigma, epsilon)
    if noise not in ("local", "central"):
        raise ConfigError(f"scheme 'qsgd-dp': noise must be 'local' or 'central', got {noise!r} "
                          "(distributed shares would be quantized before they sum: no Gaussian guarantee)")
    sampling, wor, event, rel = client_sampling("qsgd-dp", noise, sampling, n_clients, cohort_size, privacy)
    clip_step, quant = Clip(clip), QSGDStep(levels, bucket)
    # central: the server noises the mean of Q(clip(v)), and ‖Q(v)‖ ≤ (1 + √B/s)·‖v‖ (+ float margin)
    sens = clip_step if noise == "local" else Clip(clip * (1 + math.sqrt(bucket) / levels) * (1 + 1e-6))
    sigma = sigma or calibrated_sigma(epsilon, privacy, sampling_rate, rounds, event, (), rel)
    noise_step = GaussianNoise(sigma, sens, sampling_rate, 0, noise, without_replacement=wor)
    chain = [clip_step, noise_step, quant] if noise == "local" else [clip_step, quant, noise_step]
    return Scheme("qsgd-dp", chain, PlainDP(QSGDCodec(levels, bucket)), DPMeanAggregator(), privacy_sampling=sampling)
