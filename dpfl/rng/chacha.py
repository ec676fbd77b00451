"""ChaCha20 (RFC 8439) keystream blocks in integer tensor ops, on any device.

`CryptoRNG`'s stream under a 32-byte key is ChaCha20 with a zero 96-bit nonce and block
counter 0, 1, 2, ... (on the CPU OpenSSL computes it through `cryptography`). Here the same
blocks are computed from (key, counter) pairs in torch int64 arithmetic (mod 2^32 by masks), so
that a stream can be read at any position on the device that holds the tensors; on CUDA a Triton
kernel (`dpfl.rng.cuda`) gives the same words faster. Tests check both against OpenSSL.
"""

from __future__ import annotations

import struct

import torch

SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
M32 = 0xFFFFFFFF
MAX_BLOCKS = 1 << 32  # the 32-bit block counter: 256 GiB of keystream per key


def key_words(key: bytes) -> list[int]:
    return list(struct.unpack("<8I", key))


def _rotl(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x << n) & M32) | (x >> (32 - n))


def _qr(x: list, a: int, b: int, c: int, d: int) -> None:
    x[a] = (x[a] + x[b]) & M32
    x[d] = _rotl(x[d] ^ x[a], 16)
    x[c] = (x[c] + x[d]) & M32
    x[b] = _rotl(x[b] ^ x[c], 12)
    x[a] = (x[a] + x[b]) & M32
    x[d] = _rotl(x[d] ^ x[a], 8)
    x[c] = (x[c] + x[d]) & M32
    x[b] = _rotl(x[b] ^ x[c], 7)


def blocks_eager(keys: torch.Tensor, key_idx: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    """ChaCha20 blocks [m, 16] (int64 holding uint32 words) for key keys[key_idx[e]] (keys: [k, 8]
    int64 words) and block counter ctr[e] (zero nonce)."""
    kw = keys[key_idx]  # [m, 8]
    zero = torch.zeros_like(ctr)
    init = [zero + s for s in SIGMA] + [kw[:, j] for j in range(8)] + [ctr & M32, zero, zero, zero]
    x = list(init)
    for _ in range(10):
        _qr(x, 0, 4, 8, 12)
        _qr(x, 1, 5, 9, 13)
        _qr(x, 2, 6, 10, 14)
        _qr(x, 3, 7, 11, 15)
        _qr(x, 0, 5, 10, 15)
        _qr(x, 1, 6, 11, 12)
        _qr(x, 2, 7, 8, 13)
        _qr(x, 3, 4, 9, 14)
    return torch.stack([(a + b) & M32 for a, b in zip(x, init)], dim=1)


def blocks(keys: torch.Tensor, key_idx: torch.Tensor, ctr: torch.Tensor) -> torch.Tensor:
    """`blocks_eager`'s values, by the Triton kernel where the tensors are on a CUDA device."""
    if keys.device.type == "cuda":
        from dpfl.rng import cuda

        return cuda.blocks(keys, key_idx, ctr)
    return blocks_eager(keys, key_idx, ctr)


def to_words64(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Little-endian 64-bit words from their 32-bit halves, as int64 (two's complement)."""
    return ((hi ^ 0x80000000) - 0x80000000) * (1 << 32) + lo


def words64_at(keys: torch.Tensor, key_idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """64-bit keystream words number pos[e] (in 8-byte units) of key keys[key_idx[e]], as int64."""
    if pos.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=keys.device)
    b = blocks(keys, key_idx, pos >> 3)
    lane = (pos & 7).unsqueeze(1) * 2
    return to_words64(b.gather(1, lane).squeeze(1), b.gather(1, lane + 1).squeeze(1))


def _rows(keys: torch.Tensor, start: torch.Tensor, n: int, per_block: int) -> torch.Tensor:
    """[k, n] consecutive keystream words of each key from word start[r], a block holding
    `per_block` words (8 of 64 bits, or 16 of 32 bits): int64 64-bit words or 32-bit values."""
    k = keys.shape[0]
    if n == 0:
        return torch.empty(k, 0, dtype=torch.int64, device=keys.device)
    first = start // per_block
    nb = int(((start + n - 1) // per_block).max() - first.min()) + 1
    rows = torch.arange(k, device=keys.device).repeat_interleave(nb)
    ctr = (first.unsqueeze(1) + torch.arange(nb, device=keys.device)).reshape(-1)
    b = blocks(keys, rows, ctr)
    w = to_words64(b[:, 0::2], b[:, 1::2]) if per_block == 8 else b
    off = (start - first * per_block).unsqueeze(1) + torch.arange(n, device=keys.device)
    return w.reshape(k, nb * per_block).gather(1, off)


def words64_rows(keys: torch.Tensor, start: torch.Tensor, n: int) -> torch.Tensor:
    """[k, n]: n consecutive 64-bit words of each key's stream from word start[r] (int64)."""
    return _rows(keys, start, n, 8)


def words32_rows(keys: torch.Tensor, start: torch.Tensor, n: int) -> torch.Tensor:
    """[k, n]: n consecutive 32-bit keystream words (int64 in [0, 2^32)) of each key from word start[r]."""
    return _rows(keys, start, n, 16)
