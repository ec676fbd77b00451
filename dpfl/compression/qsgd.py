"""QSGD (Alistarh et al. 2017): stochastic s-level quantization with a norm per bucket.

A row v of n values is cut into buckets of B values (the last may be shorter). In a bucket b
with norm ‖v_b‖₂, value i becomes

    Q(v)_i = ‖v_b‖ · sign(v_i) · ξ_i,   ξ_i = l/s or (l+1)/s,   l = ⌊s·|v_i|/‖v_b‖⌋,

rounding up with probability s·|v_i|/‖v_b‖ − l, so E[Q(v)] = v, and (paper, Lemma 3.1)
E‖Q(v_b) − v_b‖² ≤ min(B/s², √B/s)·‖v_b‖².

Message layout (the step's output, one row per client): [norms (⌈n/B⌉) | signed levels (n)],
the levels sign(v_i)·l_i being integers in [−s, s] held exactly in float32.

Wire layout (`QSGDCodec`): per client, ⌈n/B⌉ float32 norms, n sign bits (`pack_uint`, 1 bit,
bit 1 = positive) and n level magnitudes at b = ⌈log₂(s+1)⌉ bits each (`pack_uint`), i.e.
4·⌈n/B⌉ + ⌈n/8⌉ + ⌈n·b/8⌉ bytes. Decoding yields the dequantized rows [k, n].
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dpfl.compression.base import Codec, Payload
from dpfl.compression.bits import pack_uint, unpack_uint
from dpfl.errors import ConfigError, DataError, ProtocolError

MAX_LEVELS = 2**16 - 1


def check_levels(levels: int, bucket: int) -> tuple[int, int]:
    for key, v, hi in (("levels", levels, MAX_LEVELS), ("bucket", bucket, 2**31)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= hi:
            raise ConfigError(f"QSGD {key} must be an integer in [1, {hi}], got {v!r}")
    return int(levels), int(bucket)


def level_bits(levels: int) -> int:
    """Bits per level magnitude: ⌈log₂(s + 1)⌉."""
    return max(1, math.ceil(math.log2(levels + 1)))


def n_buckets(n: int, bucket: int) -> int:
    return -(-n // bucket)


def n_values(width: int, bucket: int) -> int:
    """n from a message width n + ⌈n/B⌉ (strictly increasing in n, so n is unique)."""
    n = width - -(-width // (bucket + 1))
    if width < 0 or n + n_buckets(n, bucket) != width:
        raise ProtocolError(f"QSGD message width {width} is not n + ⌈n/{bucket}⌉ for any n")
    return n


def quantize(v: np.ndarray, levels: int, bucket: int, rng: np.random.Generator) -> np.ndarray:
    """One row v [n] → its message [norms | signed levels] as float32 [⌈n/B⌉ + n].
    Norms are summed in float64; the rounding itself runs in float32 (relative error ≤ 2⁻²³)."""
    v = np.asarray(v, dtype=np.float32)
    if v.ndim != 1 or not np.isfinite(v).all():
        raise DataError("QSGD input must be one row of finite numbers")
    n = v.size
    if n == 0:
        return np.zeros(0, np.float32)
    v64 = v.astype(np.float64)
    norm = np.sqrt(np.add.reduceat(v64 * v64, np.arange(0, n, bucket)))
    norm32 = norm.astype(np.float32)
    low = norm32 < norm  # round the sent norm up, so that s·|v_i| / norm ≤ s
    norm32[low] = np.nextafter(norm32[low], np.float32(np.inf))
    scale = np.divide(np.float32(levels), norm32, out=np.zeros_like(norm32), where=norm32 > 0)
    r = np.abs(v)
    r *= np.repeat(scale, bucket)[:n]
    np.minimum(r, np.float32(levels), out=r)
    lev = np.floor(r)
    lev += rng.random(n, dtype=np.float32) < r - lev  # up with probability r − l: E[lev] = r
    return np.concatenate([norm32, np.copysign(lev, v)])


def dequantize(norms: np.ndarray, signed_levels: np.ndarray, levels: int, bucket: int) -> np.ndarray:
    """[k, nb] norms and [k, n] signed levels → Q(v) [k, n] float32."""
    n = signed_levels.shape[1]
    per_value = np.repeat(norms.astype(np.float32), bucket, axis=1)[:, :n]
    return (per_value * (signed_levels.astype(np.float32) / np.float32(levels))).astype(np.float32)


class QSGDCodec(Codec):
    """Packs QSGD messages (see the module doc) and decodes them to the dequantized rows."""

    def __init__(self, levels: int = 15, bucket: int = 512):
        self.levels, self.bucket = check_levels(levels, bucket)
        self.bits = level_bits(self.levels)
        self.name = f"qsgd(s={self.levels}, B={self.bucket})"

    def nbytes(self, n: int) -> int:
        """Bytes one client sends for n values (what `encode` produces)."""
        return 4 * n_buckets(n, self.bucket) + (n + 7) // 8 + (n * self.bits + 7) // 8

    def encode(self, rows: torch.Tensor, rng: np.random.Generator | None = None) -> Payload:
        x = rows.detach().to("cpu", torch.float32).numpy()
        if x.ndim != 2:
            raise DataError(f"QSGD messages must have shape [k, d], got {x.shape}")
        n = n_values(x.shape[1], self.bucket)
        norms, q = x[:, : x.shape[1] - n], x[:, x.shape[1] - n :]
        if not (np.isfinite(norms).all() and (norms >= 0).all()):
            raise DataError("QSGD norms must be finite and ≥ 0")
        if not (np.abs(q) <= self.levels).all() or (q != np.round(q)).any():
            raise DataError(f"QSGD levels must be integers in [−{self.levels}, {self.levels}]")
        signs = np.zeros((len(x), (n + 7) // 8), np.uint8)
        mags = np.zeros((len(x), (n * self.bits + 7) // 8), np.uint8)
        for i in range(len(x)):  # row by row: pack_uint works in uint64
            signs[i] = pack_uint((q[i : i + 1] > 0).astype(np.uint8), 1)[0]
            mags[i] = pack_uint(np.abs(q[i : i + 1]).astype(np.uint32), self.bits)[0]
        return Payload({"norms": np.ascontiguousarray(norms), "signs": signs, "levels": mags}, {"n": n})

    def decode(self, payload: Payload, d: int) -> torch.Tensor:
        n = n_values(d, self.bucket)
        nb = n_buckets(n, self.bucket)
        shapes = {"norms": (np.float32, nb), "signs": (np.uint8, (n + 7) // 8),
                  "levels": (np.uint8, (n * self.bits + 7) // 8)}
        arrays = payload.arrays
        if set(arrays) != set(shapes):
            raise ProtocolError(f"QSGD payload must hold exactly {sorted(shapes)}, got {sorted(arrays)}")
        k = len(arrays["norms"])
        for key, (dtype, width) in shapes.items():
            a = arrays[key]
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != (k, width):
                raise ProtocolError(f"QSGD {key} must be {np.dtype(dtype).name} [{k}, {width}]")
        norms = arrays["norms"]
        if not (np.isfinite(norms).all() and (norms >= 0).all()):
            raise ProtocolError("QSGD norms must be finite and ≥ 0")
        out = np.empty((k, n), np.float32)
        for i in range(k):  # row by row: unpack_uint returns uint64
            mags = unpack_uint(arrays["levels"][i : i + 1], n, self.bits)
            if mags.size and int(mags.max()) > self.levels:
                raise ProtocolError(f"QSGD level {int(mags.max())} exceeds s = {self.levels}")
            sign = unpack_uint(arrays["signs"][i : i + 1], n, 1).astype(np.float32) * 2 - 1
            out[i] = dequantize(norms[i : i + 1], sign * mags.astype(np.float32), self.levels, self.bucket)[0]
        return torch.from_numpy(out)
