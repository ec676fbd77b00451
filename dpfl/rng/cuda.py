"""Triton kernels for CUDA: ChaCha20 blocks (the values of `chacha.blocks_eager`) and the
Gaussian fast path fused with them (the values of `gauss.fast`; NaN marks a rejected candidate).
Imported only when a tensor is on a CUDA device."""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CUDA builds of torch ship Triton
    triton = None


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _rotl(x, n: tl.constexpr):
        return (x << n) | (x >> (32 - n))

    @triton.jit
    def _qr(a, b, c, d):
        a = a + b
        d = _rotl(d ^ a, 16)
        c = c + d
        b = _rotl(b ^ c, 12)
        a = a + b
        d = _rotl(d ^ a, 8)
        c = c + d
        b = _rotl(b ^ c, 7)
        return a, b, c, d

    @triton.jit
    def _chacha(k0, k1, k2, k3, k4, k5, k6, k7, ctr):
        z = ctr * 0
        i0, i1, i2, i3 = z + 0x61707865, z + 0x3320646E, z + 0x79622D32, z + 0x6B206574
        i4, i5, i6, i7, i8, i9, i10, i11 = z + k0, z + k1, z + k2, z + k3, z + k4, z + k5, z + k6, z + k7
        x0, x1, x2, x3, x4, x5, x6, x7 = i0, i1, i2, i3, i4, i5, i6, i7
        x8, x9, x10, x11, x12, x13, x14, x15 = i8, i9, i10, i11, ctr, z, z, z
        for _ in tl.static_range(10):
            x0, x4, x8, x12 = _qr(x0, x4, x8, x12)
            x1, x5, x9, x13 = _qr(x1, x5, x9, x13)
            x2, x6, x10, x14 = _qr(x2, x6, x10, x14)
            x3, x7, x11, x15 = _qr(x3, x7, x11, x15)
            x0, x5, x10, x15 = _qr(x0, x5, x10, x15)
            x1, x6, x11, x12 = _qr(x1, x6, x11, x12)
            x2, x7, x8, x13 = _qr(x2, x7, x8, x13)
            x3, x4, x9, x14 = _qr(x3, x4, x9, x14)
        return (x0 + i0, x1 + i1, x2 + i2, x3 + i3, x4 + i4, x5 + i5, x6 + i6, x7 + i7,
                x8 + i8, x9 + i9, x10 + i10, x11 + i11, x12 + ctr, x13, x14, x15)

    @triton.jit
    def _key(keys_ptr, base, mask):
        return (tl.load(keys_ptr + base + 0, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 1, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 2, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 3, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 4, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 5, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 6, mask=mask, other=0).to(tl.uint32),
                tl.load(keys_ptr + base + 7, mask=mask, other=0).to(tl.uint32))

    @triton.jit
    def _inter8(v0, v1, v2, v3, v4, v5, v6, v7):
        """[BLK] x 8 -> [BLK, 8] with v_l at [:, l] (the new dim of a join is last: lane bit 0 joins last)."""
        e = tl.join(tl.join(v0, v4), tl.join(v2, v6))
        o = tl.join(tl.join(v1, v5), tl.join(v3, v7))
        return tl.join(e, o)

    @triton.jit
    def _key1(keys_ptr, base):
        return (tl.load(keys_ptr + base + 0).to(tl.uint32), tl.load(keys_ptr + base + 1).to(tl.uint32),
                tl.load(keys_ptr + base + 2).to(tl.uint32), tl.load(keys_ptr + base + 3).to(tl.uint32),
                tl.load(keys_ptr + base + 4).to(tl.uint32), tl.load(keys_ptr + base + 5).to(tl.uint32),
                tl.load(keys_ptr + base + 6).to(tl.uint32), tl.load(keys_ptr + base + 7).to(tl.uint32))

    @triton.jit
    def _blocks_kernel(keys_ptr, kidx_ptr, ctr_ptr, out_ptr, m, BLK: tl.constexpr):
        e = tl.program_id(0) * BLK + tl.arange(0, BLK)
        mask = e < m
        ki = tl.load(kidx_ptr + e, mask=mask, other=0)
        ctr = tl.load(ctr_ptr + e, mask=mask, other=0).to(tl.uint32)
        k0, k1, k2, k3, k4, k5, k6, k7 = _key(keys_ptr, ki * 8, mask)
        x = _chacha(k0, k1, k2, k3, k4, k5, k6, k7, ctr)
        lo = _inter8(x[0], x[2], x[4], x[6], x[8], x[10], x[12], x[14])  # words 0, 2, 4, ... of each block
        hi = _inter8(x[1], x[3], x[5], x[7], x[9], x[11], x[13], x[15])
        w = tl.reshape(tl.join(lo, hi), [16 * BLK]).to(tl.int64)  # [BLK, 8, 2] row-major: word 2l + h
        off = tl.program_id(0).to(tl.int64) * 16 * BLK + tl.arange(0, 16 * BLK)
        tl.store(out_ptr + off, w, mask=off < m * 16)

    @triton.jit
    def _value(lo, hi, wt_ptr, kt_ptr, std):
        w = (lo.to(tl.uint64) | (hi.to(tl.uint64) << 32)).to(tl.int64, bitcast=True)
        i = w & 255
        j = (w >> 10) | 1
        val = (j.to(tl.float64) * tl.load(wt_ptr + i)) * std
        aj = tl.where(j < 0, -j, j)
        return tl.where(aj < tl.load(kt_ptr + i), val, float("nan"))

    @triton.jit
    def _gauss_kernel(keys_ptr, start_ptr, out_ptr, wt_ptr, kt_ptr, std_ptr, n, BLK: tl.constexpr):
        row = tl.program_id(1)
        s = tl.load(start_ptr + row)
        b0 = (s >> 3) + tl.program_id(0).to(tl.int64) * BLK
        b = b0 + tl.arange(0, BLK)
        k0, k1, k2, k3, k4, k5, k6, k7 = _key1(keys_ptr, row * 8)
        x = _chacha(k0, k1, k2, k3, k4, k5, k6, k7, b.to(tl.uint32))
        std = tl.load(std_ptr)
        v = _inter8(_value(x[0], x[1], wt_ptr, kt_ptr, std), _value(x[2], x[3], wt_ptr, kt_ptr, std),
                    _value(x[4], x[5], wt_ptr, kt_ptr, std), _value(x[6], x[7], wt_ptr, kt_ptr, std),
                    _value(x[8], x[9], wt_ptr, kt_ptr, std), _value(x[10], x[11], wt_ptr, kt_ptr, std),
                    _value(x[12], x[13], wt_ptr, kt_ptr, std), _value(x[14], x[15], wt_ptr, kt_ptr, std))
        pos = b0 * 8 - s + tl.arange(0, 8 * BLK)  # word 8b + lane of the stream is value 8b + lane - s
        o = out_ptr + row.to(tl.int64) * n
        tl.store(o + pos, tl.reshape(v, [8 * BLK]).to(out_ptr.dtype.element_ty), mask=(pos >= 0) & (pos < n))


_BLK = 256


def blocks(keys: torch.Tensor, key_idx: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    m = key_idx.numel()
    out = torch.empty(m, 16, dtype=torch.int64, device=keys.device)
    if m:
        _blocks_kernel[(triton.cdiv(m, _BLK),)](keys.contiguous(), key_idx.contiguous(), ctr.contiguous(), out, m,
                                               BLK=_BLK)
    return out


def gauss_fast(keys: torch.Tensor, start: torch.Tensor, out: torch.Tensor, std: float) -> None:
    from dpfl.rng.gauss import tables

    k, n = out.shape
    wt, kt, _ = tables(str(out.device))
    std_t = torch.tensor([float(std)], dtype=torch.float64, device=out.device)
    nb = n // 8 + 2
    _gauss_kernel[(triton.cdiv(nb, _BLK), k)](keys.contiguous(), start.contiguous(), out, wt, kt, std_t, n,
                                              BLK=_BLK)
