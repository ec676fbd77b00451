"""QSGD's client step: each client quantizes its row with its own seeded generator.

Output: the QSGD message [norms | signed levels] (`dpfl.compression.qsgd`), which `QSGDCodec`
packs for the wire and decodes to the dequantized rows Q(Δw_k): the server side is the identity.
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.compression.qsgd import check_levels, n_buckets, quantize
from dpfl.schemes.base import RoundContext, Step


class QSGDStep(Step):
    name = "qsgd"

    def __init__(self, levels: int = 15, bucket: int = 512):
        self.levels, self.bucket = check_levels(levels, bucket)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        # rounding draws per client (row i is client ctx.cohort[i]): a deployed client draws the same
        n = u.shape[1]
        out = np.empty((len(ctx.cohort), n_buckets(n, self.bucket) + n), np.float32)
        for i, c in enumerate(ctx.cohort):
            out[i] = quantize(u[i].detach().to("cpu", torch.float32).numpy(), self.levels, self.bucket,
                              ctx.numpy_rng("qsgd", int(c)))
        return torch.from_numpy(out).to(u.device)

    def describe(self) -> str:
        return f"qsgd(s={self.levels}, B={self.bucket})"
