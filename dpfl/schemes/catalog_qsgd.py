"""QSGD and QSGD-DP, written only against the scheme contract (see docs/adding-a-scheme.md).

    qsgd     QSGD quantize (s levels, bucket B)          | weighted mean of the dequantized rows
    qsgd-dp  local:   clip → Gaussian noise → QSGD      | DP mean   (quantization is post-processing)
             central: clip → QSGD → (server) Gaussian noise on the mean, sensitivity (1 + √B/s)·S
"""

from __future__ import annotations

import math

from dpfl.compression.qsgd import QSGDCodec
from dpfl.schemes.aggregators import WeightedMeanAggregator
from dpfl.schemes.dp_options import DPOptions, register_dp
from dpfl.schemes.dp_wrapper import make_private
from dpfl.schemes.qsgd import QSGDStep
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.transport import PlainTransport


@register("qsgd")
def qsgd(levels: int = 15, bucket: int = 512) -> Scheme:
    return Scheme("qsgd", [QSGDStep(levels, bucket)], PlainTransport(QSGDCodec(levels, bucket)),
                  WeightedMeanAggregator())


@register_dp("qsgd-dp", noise="local", clip=1.0)
def qsgd_dp(dp: DPOptions, levels: int = 15, bucket: int = 512) -> Scheme:
    # quantization runs on the noisy row; ‖Q(v)‖ ≤ (1 + √B/s)·‖v‖ bounds it for central noise
    return make_private(qsgd(levels, bucket), dp, post_processing=True, norm_growth=1 + math.sqrt(bucket) / levels)
