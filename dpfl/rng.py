"""Randomness: deterministic per-purpose streams for simulation, and a CSPRNG for secrets.

`Seeds(root)` derives independent, reproducible generators from one integer seed and a
purpose path ("round", 7, "select"), so that adding a new consumer never shifts the draws of
another. `CryptoRNG` is AES-256-CTR keyed either from the OS (deployment) or from a seed
(reproducible simulation); it is used wherever secrets or DP noise are drawn.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def derive_key(root: int | bytes, *path: object, nbytes: int = 32) -> bytes:
    """Hash a root seed and a purpose path into `nbytes` of key material (SHA-256 based)."""
    h = hashlib.sha256()
    h.update(root if isinstance(root, bytes) else struct.pack("<q", int(root)))
    for p in path:
        b = str(p).encode()
        h.update(struct.pack("<I", len(b)) + b)
    out = h.digest()
    while len(out) < nbytes:
        out += hashlib.sha256(out).digest()
    return out[:nbytes]


def derive_seed(root: int, *path: object) -> int:
    """A 63-bit integer seed for `path` under `root`."""
    return int.from_bytes(derive_key(root, *path, nbytes=8), "little") >> 1


class Seeds:
    """Named, reproducible random streams under one root seed."""

    def __init__(self, root: int):
        self.root = int(root)

    def seed(self, *path: object) -> int:
        return derive_seed(self.root, *path)

    def numpy(self, *path: object) -> np.random.Generator:
        return np.random.default_rng(self.seed(*path))

    def torch(self, *path: object, device: str | torch.device = "cpu") -> torch.Generator:
        import torch  # here, not at the top: NumPy-only users (dpfl.classic, dpfl.stats) skip its import

        g = torch.Generator(device=device)
        g.manual_seed(self.seed(*path))
        return g

    def crypto(self, *path: object) -> CryptoRNG:
        return CryptoRNG(key=derive_key(self.root, "crypto", *path))


_CHUNK = 1 << 16  # words per chunk of `gaussian_into` (512 KiB of keystream: stays in cache)


class CryptoRNG:
    """AES-256-CTR keystream as a random source.

    `CryptoRNG()` keys itself from `os.urandom` (use this for real secrets);
    `CryptoRNG(key=...)` is reproducible (simulation with a seed).
    """

    def __init__(self, key: bytes | None = None):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self.seeded = key is not None
        key = os.urandom(32) if key is None else key
        if len(key) != 32:
            raise ValueError("CryptoRNG key must be 32 bytes")
        self._enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()

    def bytes(self, n: int) -> bytes:
        return self._enc.update(b"\x00" * n)

    def uint64(self, n: int) -> np.ndarray:
        """n words of keystream (the same bytes as `bytes(8n)`), written straight into the array."""
        out = np.empty(8 * n + 15, dtype=np.uint8)  # update_into wants block size - 1 spare bytes
        done = self._enc.update_into(np.zeros(8 * n, dtype=np.uint8), out)
        assert done == 8 * n
        return out[: 8 * n].view("<u8")

    def gaussian_into(self, out: torch.Tensor, std: float) -> torch.Tensor:
        """Fill the contiguous CPU float tensor `out` with N(0, std²) noise, dpfl's one Gaussian
        sampler (`dpfl.pate.noise.gaussian` and `dpfl.privacy.mechanisms.gaussian_noise` draw
        through it): Box–Muller in float64 on open 53-bit uniforms, radii from the first half of
        the keystream words and angles from the second, r·cos θ then r·sin θ, rounded to `out.dtype`.
        Works in cache-sized chunks with no full-size float64 or keystream array: about twice as
        fast for a million values."""
        import torch

        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"Gaussian std must be >= 0 and finite, got {std}")
        if not (out.is_contiguous() and out.dtype.is_floating_point and out.device.type == "cpu"):
            raise ValueError("gaussian_into needs a contiguous float tensor on the CPU")
        flat, n = out.view(-1), out.numel()
        half = (n + 1) // 2
        ch = min(_CHUNK, half) or 1
        zeros = np.zeros(8 * ch, dtype=np.uint8)
        buf = np.empty(8 * ch + 15, dtype=np.uint8)  # update_into wants block size - 1 spare bytes
        words = buf[: 8 * ch].view("<u8")
        radius = torch.empty(half, dtype=torch.float64)
        u = torch.empty(ch, dtype=torch.float64)
        z = torch.empty(ch, dtype=torch.float64)

        def uniforms(m: int) -> torch.Tensor:  # next m open uniforms (k + 1/2) / 2^53, as pate.noise
            self._enc.update_into(zeros[: 8 * m], buf)
            np.right_shift(words[:m], np.uint64(11), out=words[:m])
            return u[:m].copy_(torch.from_numpy(words[:m].view(np.int64))).add_(0.5).mul_(1.0 / (1 << 53))

        for s in range(0, half, ch):  # first half of the words: radii sqrt(-2 ln u)·std
            r = radius[s : s + ch]
            torch.log(uniforms(r.numel()), out=r).mul_(-2.0).sqrt_().mul_(float(std))
        for s in range(0, half, ch):  # second half: angles 2πu; cos to out[:half], sin to out[half:]
            r = radius[s : s + ch]
            m = r.numel()
            angle = uniforms(m).mul_(2.0 * math.pi)
            flat[s : s + m].copy_(torch.cos(angle, out=z[:m]).mul_(r))
            tail = min(m, n - half - s)  # odd n: the last sine is dropped
            if tail > 0:
                flat[half + s : half + s + tail].copy_(torch.sin(angle[:tail], out=z[:tail]).mul_(r[:tail]))
        return out

    def uint32(self, n: int) -> np.ndarray:
        return np.frombuffer(self.bytes(4 * n), dtype="<u4").copy()

    def uniform(self, n: int) -> np.ndarray:
        """Uniform floats in [0, 1) with 53 random bits each."""
        return (self.uint64(n) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def randbelow(self, n: int, bound: int) -> np.ndarray:
        """Unbiased integers in [0, bound) (rejection sampling), bound < 2**63."""
        if bound <= 0:
            raise ValueError("bound must be positive")
        limit = (1 << 64) - ((1 << 64) % bound)
        out = np.empty(0, dtype=np.uint64)
        while out.size < n:
            x = self.uint64(max(16, int((n - out.size) * 1.1)))
            x = x[x < np.uint64(limit)] if limit < (1 << 64) else x
            out = np.concatenate([out, x])
        return (out[:n] % np.uint64(bound)).astype(np.int64)
