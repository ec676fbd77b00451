"""The plain (non-secure) transport: every client's row reaches the server, encoded by a codec."""

from __future__ import annotations

import numpy as np
import torch

from dpfl.compression.base import Codec, Float32Codec
from dpfl.schemes.base import Received, RoundContext, Transport
from dpfl.threads import for_blocks


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
    """Σ over clients (dim 0), exact. Small integer rows on CPU are summed by NumPy into int64
    (faster than torch's int8 column reduction); int8/int16 rows through an int32 accumulator a
    block of columns at a time, blocks split across threads (exact below 65,536 rows:
    |Σ| < 2**15 · 2**16)."""
    if rows.device.type != "cpu" or rows.dtype not in (torch.int8, torch.int16, torch.int32):
        return rows.sum(0)
    r = rows.numpy()
    if rows.dtype == torch.int32 or r.shape[0] >= 1 << 16:
        return torch.from_numpy(r.sum(0, dtype=np.int64))
    out = np.empty(r.shape[1], np.int64)

    def block(b0: int, b1: int) -> None:  # column blocks b0..b1-1, one thread
        acc = np.empty(_COLUMNS, np.int32)
        for c0 in range(b0 * _COLUMNS, min(b1 * _COLUMNS, r.shape[1]), _COLUMNS):
            a = acc[: min(_COLUMNS, r.shape[1] - c0)]
            a[:] = 0
            for row in r[:, c0 : c0 + _COLUMNS]:
                a += row
            out[c0 : c0 + len(a)] = a

    for_blocks(-(-r.shape[1] // _COLUMNS), block)
    return torch.from_numpy(out)


_COLUMNS = 1 << 16  # columns summed at a time: the int32 block stays in cache


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
