"""The plain (non-secure) transport: every client's row reaches the server, encoded by a codec."""

from __future__ import annotations

import numpy as np
import torch

from dpfl.compression.base import Codec, Float32Codec
from dpfl.schemes.base import Received, RoundContext, Transport


class PlainTransport(Transport):
    """Each client sends its row encoded by `codec`; the server decodes every row."""

    def __init__(self, codec: Codec | None = None):
        self.codec = codec or Float32Codec()
        self.name = f"plain/{self.codec.name}"
        self.bits_per_value = self.codec.bits_per_value

    def transmit(self, u: torch.Tensor, ctx: RoundContext) -> Received:
        payload = self.codec.encode(u, ctx.numpy_rng("encode"))
        rows = self.codec.decode(payload, u.shape[1]).to(u.device)
        return Received(rows=rows, total=sum_rows(rows), count=rows.shape[0],
                        upstream_bytes=payload.per_client_nbytes())


def sum_rows(rows: torch.Tensor) -> torch.Tensor:
    """Σ over clients (dim 0). Small integer rows on CPU are summed by NumPy into int64 (exact,
    like torch's sum, and ~6× faster than torch's int8 column reduction)."""
    if rows.device.type == "cpu" and rows.dtype in (torch.int8, torch.int16, torch.int32):
        return torch.from_numpy(rows.numpy().sum(0, dtype=np.int64))
    return rows.sum(0)


def report_bits(rec: Received, d: int, ctx: RoundContext) -> None:
    sent = np.asarray(rec.upstream_bytes)
    sent = sent[sent > 0]
    if sent.size and d:
        ctx.metrics["up_bits_per_value"] = float(8.0 * sent.mean() / d)


class PlainDP(PlainTransport):
    """Plain transport (local or central noise) that also reports measured bits per value."""

    def __init__(self, codec: Codec | None = None):
        super().__init__(codec)
        self.bits_per_value = getattr(self.codec, "bits_per_value", 32)

    def transmit(self, u: torch.Tensor, ctx: RoundContext) -> Received:
        rec = super().transmit(u, ctx)
        report_bits(rec, u.shape[1], ctx)
        return rec
