"""Bit packing: signs at 1 bit per value and unsigned integers at b bits per value (1 ≤ b ≤ 64).

Wire layout (both packers): one little-endian bit stream per row. Value i occupies stream bits
[i·b, (i+1)·b), least significant bit first; stream bit j is bit (j mod 8) of byte j // 8.
A row of d values takes ceil(d·b / 8) bytes; unused high bits of the last byte are zero (and
decoders reject a payload where they are not).
"""

from __future__ import annotations

from math import gcd
from typing import TYPE_CHECKING

import numpy as np

from dpfl.compression.base import Codec, Payload
from dpfl.errors import ConfigError, DataError, ProtocolError
from dpfl.threads import for_blocks

if TYPE_CHECKING:  # imported by the functions that take tensors: packing words needs only NumPy
    import torch

_BLOCK = 1 << 22  # values per row block (bounds temporary memory)
_CACHE_GROUPS = 8192  # value groups per inner block


def _min_rows(n: int) -> int:
    """Rows a thread takes at least: a block under ~256k values is not worth a thread."""
    return max(1, (1 << 18) // max(n, 1))


def packed_nbytes(d: int, bits: int) -> int:
    """Bytes one row of `d` values takes at `bits` bits per value."""
    return (d * bits + 7) // 8


def _check_bits(bits: int) -> int:
    if not isinstance(bits, (int, np.integer)) or not 1 <= int(bits) <= 64:
        raise ConfigError(f"bits must be an integer in [1, 64], got {bits!r}")
    return int(bits)


def _as_2d(a: np.ndarray, what: str) -> np.ndarray:
    if a.ndim != 2:
        raise DataError(f"{what} must have shape [k, d], got shape {a.shape}")
    return a


def _check_tail(packed: np.ndarray, d: int, bits: int) -> None:
    """Reject payloads whose padding bits (after the last value) are not zero."""
    used = d * bits
    if used % 8 and packed.shape[1]:
        spare = packed[:, -1] >> np.uint8(used % 8)
        if spare.any():
            raise ProtocolError("packed payload has non-zero padding bits after the last value")


# ---------------------------------------------------------------- signs (1 bit)


def random_sign(x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """sign(x) as int8 ±1, exact zeros replaced by a uniformly random sign (thesis §4.1.1).

    The random signs come from `rng` (required if any zero is present), one per zero in
    row-major order, so the same generator state gives the same result.
    """
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise DataError(f"sign input must be numeric, got dtype {x.dtype}")
    out = np.empty(x.shape, np.int8)
    _sign_into(x.ravel(), out.reshape(-1), lambda: rng)
    return out


def _sign_into(r: np.ndarray, o: np.ndarray, rng) -> None:
    """`random_sign` of the 1-D `r` into the int8 `o`, its zeros drawn from `rng()` (called only if
    there is a zero): one pass each to sign and to find the zeros, no temporary of r's size but the mask."""
    if r.dtype.kind == "f" and _nan_sum(r) and np.isnan(r).any():
        raise DataError("sign input contains NaN; the sign of NaN is undefined")
    np.greater(r, 0, out=o.view(np.bool_))  # 1 where positive, else 0; then ±1 in place
    o += o
    o -= 1
    zeros = np.flatnonzero(r == 0)  # indices: setting by them is ~3x faster than by a boolean mask
    if zeros.size:  # the draws fill the zeros in row-major order
        g = rng()
        if g is None:
            raise ConfigError("a numpy Generator is needed to draw random signs for exact zeros")
        o[zeros] = random_signs(g, zeros.size)


def random_signs(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` uniform signs, int8 ±1: exactly `2·rng.integers(0, 2, count, dtype=int8) − 1`, the
    generator left in the same state. For PCG64 (NumPy's default) without a buffered half word the
    draw reads the raw 64-bit words directly: NumPy makes each value from one byte of its 32-bit
    draws (the low half of a 64-bit word first) as byte >> 7, with no rejection for a range of 2."""
    bg = rng.bit_generator
    if count <= 0 or type(bg) is not np.random.PCG64 or bg.state["has_uint32"]:
        return (rng.integers(0, 2, size=count, dtype=np.int8) << 1) - np.int8(1)
    n32 = (count + 3) // 4  # 32-bit draws integers() would take (the tail of the last one is discarded)
    raw = bg.random_raw((n32 + 1) // 2)
    st = bg.state  # as integers() leaves it: the last word's high half kept, pending if n32 is odd
    st["has_uint32"], st["uinteger"] = n32 % 2, int(raw[-1] >> np.uint64(32))
    bg.state = st
    b = raw.astype("<u8", copy=False).view(np.uint8)[:count] >> np.uint8(7)  # bytes in stream order
    return (b.view(np.int8) << 1) - np.int8(1)


def _nan_sum(x: np.ndarray) -> bool:
    """Whether the sum of `x` is NaN: always when it holds a NaN (also when it holds +inf and −inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.isnan(np.add.reduce(x, axis=None)))


def random_sign_rows(x: torch.Tensor, rng_for_row) -> torch.Tensor:
    """`random_sign` of each row of a [k, n] tensor, row i's zeros drawn from `rng_for_row(i)`:
    the same int8 result as calling `random_sign` row by row; the generator of a row without zeros
    is never created. On CPU, blocks of rows run in parallel threads: `rng_for_row(i)` must return
    row i's own generator (not one shared between rows) and be safe to call from any thread."""
    import torch

    if x.dim() != 2:
        raise DataError(f"sign input must have shape [k, n], got shape {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise DataError(f"sign input must be numeric, got dtype {x.dtype}")
    if x.device.type == "cpu":  # NumPy row by row: the row stays in cache (bfloat16 as float32: same signs)
        xn = (x.float() if x.dtype == torch.bfloat16 else x).detach().numpy()
        out = np.empty(xn.shape, np.int8)

        def block(r0: int, r1: int) -> None:
            for i in range(r0, r1):
                _sign_into(xn[i], out[i], lambda: rng_for_row(i))  # noqa: B023 (called before the next i)

        for_blocks(xn.shape[0], block, min_block=_min_rows(xn.shape[1]))
        return torch.from_numpy(out)
    if x.is_floating_point() and torch.isnan(x.sum()) and torch.isnan(x).any():  # a NaN makes the sum NaN
        raise DataError("sign input contains NaN; the sign of NaN is undefined")
    out = torch.gt(x, 0).view(torch.int8)  # 1 where positive, else 0: one int8 array, then in place
    out.add_(out).sub_(1)
    for i in range(x.shape[0]):  # on the device; only zeros change, in row-major order
        zero = x[i] == 0
        nz = int(torch.count_nonzero(zero))
        if nz:
            out[i].masked_scatter_(zero, torch.from_numpy(random_signs(rng_for_row(i), nz)).to(out.device))
    return out


def pack_signs(x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """Pack `random_sign(x, rng)` of a [k, n] array into uint8 [k, ceil(n/8)] (bit 1 = positive)."""
    x = _as_2d(np.asarray(x), "sign input")
    return np.packbits(random_sign(x, rng) > 0, axis=-1, bitorder="little")


def unpack_signs(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of `pack_signs`: int8 [k, n] with values ±1."""
    packed = _as_2d(np.asarray(packed), "packed signs")
    if packed.dtype != np.uint8 or packed.shape[1] != packed_nbytes(n, 1):
        raise ProtocolError(
            f"sign payload must be uint8 [k, {packed_nbytes(n, 1)}] for n={n}, got {packed.dtype} {packed.shape}"
        )
    _check_tail(packed, n, 1)
    out = np.empty((packed.shape[0], n), np.int8)

    def block(r0: int, r1: int) -> None:
        for i in range(r0, r1):
            b = out[i]
            b[:] = np.unpackbits(packed[i], count=n, bitorder="little").view(np.int8)
            b += b  # 2·bit − 1, in place
            b -= 1

    for_blocks(packed.shape[0], block, min_block=_min_rows(n))
    return out


def _pack_positive(x: np.ndarray, rows: int = 4) -> np.ndarray:
    """packbits(x > 0) of a [k, n] array a few rows at a time (no [k, n] temporary)."""
    out = np.empty((x.shape[0], packed_nbytes(x.shape[1], 1)), np.uint8)

    def block(b0: int, b1: int) -> None:
        for r0 in range(b0, b1, rows):
            r1 = min(r0 + rows, b1)
            out[r0:r1] = np.packbits(x[r0:r1] > 0, axis=-1, bitorder="little")

    for_blocks(x.shape[0], block, min_block=_min_rows(x.shape[1]))
    return out


# ---------------------------------------------------------------- b-bit unsigned integers


_BYTE_ALIGNED = {8: np.dtype("<u1"), 16: np.dtype("<u2"), 32: np.dtype("<u4"), 64: np.dtype("<u8")}


def _layout(bits: int) -> tuple[int, int]:
    """Values per group and 64-bit words per group: p values fill exactly q words."""
    g = gcd(bits, 64)
    return 64 // g, bits // g


def pack_uint(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned integers [k, d] (each < 2**bits) into uint8 [k, ceil(d·bits/8)].

    Accepts any integer dtype; int64 input with bits = 64 is taken as its two's-complement bits.
    """
    bits = _check_bits(bits)
    v = _as_2d(np.asarray(values), "values")
    if not np.issubdtype(v.dtype, np.integer):
        raise DataError(f"pack_uint needs an integer array, got dtype {v.dtype}")
    if np.issubdtype(v.dtype, np.signedinteger) and bits < 64 and v.size and v.min() < 0:
        raise DataError(f"pack_uint values must be in [0, 2**{bits}), got a negative value {v.min()}")
    v = v.view(np.uint64) if v.dtype.itemsize == 8 else v.astype(np.uint64)
    if bits < 64 and v.size and int(v.max()) >> bits:
        raise DataError(f"pack_uint values must be in [0, 2**{bits}), got max {v.max()}")
    k, d = v.shape
    if bits in _BYTE_ALIGNED:
        return np.ascontiguousarray(v.astype(_BYTE_ALIGNED[bits])).view(np.uint8).reshape(k, -1)
    if bits == 1:
        return np.packbits(v.astype(bool), axis=-1, bitorder="little")
    p, q = _layout(bits)
    groups = -(-d // p)
    out = np.zeros((k, groups * q * 8), dtype=np.uint8)
    rows = max(1, _BLOCK // max(d, 1))
    for r0 in range(0, k, rows):
        blk = v[r0 : r0 + rows]
        if d % p:
            blk = np.concatenate([blk, np.zeros((blk.shape[0], groups * p - d), np.uint64)], axis=1)
        vg = blk.reshape(-1, p)
        words = np.zeros((vg.shape[0], q), dtype=np.uint64)
        for g0 in range(0, vg.shape[0], _CACHE_GROUPS):  # small blocks stay in cache over the p passes
            vb, wb = vg[g0 : g0 + _CACHE_GROUPS], words[g0 : g0 + _CACHE_GROUPS]
            for j in range(p):
                w, s = divmod(j * bits, 64)
                wb[:, w] |= vb[:, j] << np.uint64(s)
                if s + bits > 64:
                    wb[:, w + 1] |= vb[:, j] >> np.uint64(64 - s)
        out[r0 : r0 + rows] = words.astype("<u8", copy=False).view(np.uint8).reshape(blk.shape[0], -1)
    return out[:, : packed_nbytes(d, bits)].copy()


def unpack_uint(packed: np.ndarray, d: int, bits: int) -> np.ndarray:
    """Inverse of `pack_uint`: uint64 [k, d]."""
    bits = _check_bits(bits)
    packed = _as_2d(np.asarray(packed), "packed values")
    nbytes = packed_nbytes(d, bits)
    if packed.dtype != np.uint8 or packed.shape[1] != nbytes:
        raise ProtocolError(
            f"{bits}-bit payload must be uint8 [k, {nbytes}] for d={d}, got {packed.dtype} {packed.shape}"
        )
    _check_tail(packed, d, bits)
    k = packed.shape[0]
    if bits in _BYTE_ALIGNED:
        return np.ascontiguousarray(packed).view(_BYTE_ALIGNED[bits]).astype(np.uint64)
    if bits == 1:
        return np.unpackbits(packed, axis=-1, count=d, bitorder="little").astype(np.uint64)
    p, q = _layout(bits)
    groups = -(-d // p)
    full = np.zeros((k, groups * q * 8), dtype=np.uint8)
    full[:, :nbytes] = packed
    words = full.view("<u8").reshape(k * groups, q)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((k * groups, p), dtype=np.uint64)
    for g0 in range(0, k * groups, _CACHE_GROUPS):
        wb, ob = words[g0 : g0 + _CACHE_GROUPS], out[g0 : g0 + _CACHE_GROUPS]
        for j in range(p):
            w, s = divmod(j * bits, 64)
            col = wb[:, w] >> np.uint64(s)
            if s + bits > 64:
                col |= wb[:, w + 1] << np.uint64(64 - s)
            ob[:, j] = col & mask
    return out.reshape(k, groups * p)[:, :d]


# ---------------------------------------------------------------- codecs


class SignCodec(Codec):
    """1 bit per value: sign of each coordinate (random sign for exact zeros). Decodes to int8 ±1."""

    name = "sign"
    bits_per_value = 1

    def encode(self, rows: torch.Tensor, rng: np.random.Generator | None = None) -> Payload:
        import torch

        t = rows.detach().to("cpu")
        t = t.float() if t.dtype == torch.bfloat16 else t  # NumPy has no bfloat16; float32 has its signs
        x = t.numpy()
        if x.ndim == 2 and x.dtype.kind in "iuf" and np.count_nonzero(x) == x.size \
                and not (x.dtype.kind == "f" and _nan_sum(x)):
            # no zero and no NaN: random_sign(x) > 0 is x > 0, no draw
            return Payload({"signs": _pack_positive(x)}, {"n": int(x.shape[1])})
        return Payload({"signs": pack_signs(x, rng)}, {"n": int(x.shape[1])})

    def decode(self, payload: Payload, d: int) -> torch.Tensor:
        import torch

        return torch.from_numpy(unpack_signs(payload.arrays["signs"], d))


class UIntCodec(Codec):
    """`bits` bits per value for integers in [0, 2**bits). Decodes to int64.

    With bits = 64 the int64 rows are sent as their two's-complement bits and decoded back to
    the same int64 values (the same residues mod 2**64).
    """

    name = "uint"

    def __init__(self, bits: int):
        self.bits = _check_bits(bits)
        self.bits_per_value = self.bits
        self.name = f"uint{self.bits}"

    def encode(self, rows: torch.Tensor, rng: np.random.Generator | None = None) -> Payload:
        import torch

        if rows.is_floating_point() or rows.is_complex() or rows.dtype == torch.bool:
            raise DataError(f"{self.name} codec needs an integer tensor, got {rows.dtype}")
        x = rows.detach().to("cpu").numpy()
        return Payload({"packed": pack_uint(x, self.bits)}, {"n": int(x.shape[1]), "bits": self.bits})

    def decode(self, payload: Payload, d: int) -> torch.Tensor:
        import torch

        v = unpack_uint(payload.arrays["packed"], d, self.bits)
        return torch.from_numpy(np.ascontiguousarray(v).view(np.int64))
