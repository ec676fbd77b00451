"""Randomness: deterministic per-purpose streams for simulation, and a CSPRNG for secrets.

`Seeds(root)` derives independent, reproducible generators from one integer seed and a
purpose path ("round", 7, "select"), so that adding a new consumer never shifts the draws of
another. `CryptoRNG` is a ChaCha20 keystream keyed either from the OS (deployment) or from a seed
(reproducible simulation); it is used wherever secrets or DP noise are drawn, and its Gaussian
noise (`gaussian_into`, `gaussian_rows`) is the same on the CPU and on a GPU.
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


_CHUNK = 1 << 16  # words per chunk of a CPU Gaussian draw (512 KiB of keystream: stays in cache)


class CryptoRNG:
    """ChaCha20 keystream (RFC 8439: 32-byte key, zero nonce, block counter from 0) as a random source.

    `CryptoRNG()` keys itself from `os.urandom` (use this for real secrets);
    `CryptoRNG(key=...)` is reproducible (simulation with a seed). On the CPU OpenSSL computes the
    stream (through `cryptography`); a draw into a tensor on another device computes the same
    stream there (`dpfl.rng.chacha`), so the position in the stream is all the state there is.
    """

    def __init__(self, key: bytes | None = None):
        self.seeded = key is not None
        key = os.urandom(32) if key is None else key
        if not isinstance(key, bytes) or len(key) != 32:
            raise ValueError("CryptoRNG key must be 32 bytes")
        self._key = key
        self._pos = 0  # bytes of the stream used so far
        self._enc = None  # OpenSSL's encryptor, positioned at self._pos (made when needed)

    @property
    def position(self) -> int:
        """Bytes of the stream used so far."""
        return self._pos

    def key_words(self) -> list[int]:
        """The key as ChaCha20's eight little-endian 32-bit words (for a draw on a device)."""
        return list(struct.unpack("<8I", self._key))

    def advance(self, nbytes: int) -> None:
        """Skip `nbytes` of the stream (they were used on a device)."""
        self._check(nbytes)
        self._pos += nbytes
        self._enc = None

    def _check(self, nbytes: int) -> None:
        if (self._pos + nbytes + 63) // 64 > 1 << 32:
            raise ValueError("CryptoRNG: a stream holds 2^32 ChaCha20 blocks (256 GiB); draw from another key")

    def _encryptor(self):
        if self._enc is None:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

            block, skip = divmod(self._pos, 64)
            nonce = struct.pack("<I", block) + bytes(12)  # OpenSSL: 32-bit counter, then the 96-bit nonce
            self._enc = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
            if skip:
                self._enc.update(bytes(skip))
        return self._enc

    def bytes(self, n: int) -> bytes:
        self._check(n)
        out = self._encryptor().update(b"\x00" * n)
        self._pos += n
        return out

    def _fill(self, zeros: np.ndarray, buf: np.ndarray) -> None:
        """Next len(zeros) bytes of the stream into buf (len(zeros) + 15 bytes or more)."""
        self._check(zeros.size)
        self._encryptor().update_into(zeros, buf)
        self._pos += zeros.size

    def uint64(self, n: int) -> np.ndarray:
        """n words of keystream (the same bytes as `bytes(8n)`), written straight into the array."""
        out = np.empty(8 * n + 15, dtype=np.uint8)  # update_into wants block size - 1 spare bytes
        self._fill(np.zeros(8 * n, dtype=np.uint8), out)
        return out[: 8 * n].view("<u8")

    def gaussian_into(self, out: torch.Tensor, std: float) -> torch.Tensor:
        """Fill the contiguous float tensor `out` (any device) with N(0, std²) noise: dpfl's one
        Gaussian sampler (`dpfl.rng.gauss`, the ziggurat), one 64-bit word per value plus the
        words its rare slow path takes after them. The same values on every device."""
        _check_std(std)
        if not (out.is_contiguous() and out.dtype.is_floating_point):
            raise ValueError("gaussian_into needs a contiguous float tensor")
        if out.device.type != "cpu":
            from dpfl.rng.device import gaussian_rows

            gaussian_rows([self], out.view(1, -1), std)
            return out
        return gaussian_cpu(self.words_reader(), out, std)

    def words_reader(self):
        """f(m) -> the next m 64-bit words as int64 (a view of a reused buffer up to _CHUNK words)."""
        zeros = np.zeros(8 * _CHUNK, dtype=np.uint8)
        buf = np.empty(8 * _CHUNK + 15, dtype=np.uint8)  # update_into wants block size - 1 spare bytes

        def read(m: int) -> np.ndarray:
            if m > _CHUNK:
                return self.uint64(m).view(np.int64)
            self._fill(zeros[: 8 * m], buf)
            return buf[: 8 * m].view(np.int64)

        return read

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


def _check_std(std: float) -> None:
    if not (isinstance(std, (int, float)) and math.isfinite(std) and std >= 0):
        raise ValueError(f"Gaussian std must be >= 0 and finite, got {std}")


def gaussian_cpu(read, out, std: float):
    """Fill the contiguous CPU float tensor `out` from the word reader `read(m)` (the next m words
    as int64): keystream in cache-sized chunks through the fast path (C kernel where built), then
    the rejected candidates resolved from the words that follow (`gauss.resolve`)."""
    import torch

    from dpfl.rng import gauss

    flat, n = out.view(-1), out.numel()
    ch = min(_CHUNK, n) or 1
    rej = np.empty(ch, dtype=np.int64)
    flags = np.empty(ch, dtype=np.uint8)
    wt, kt, _ = gauss.tables("cpu")
    idx, cand = [], []
    for s in range(0, n, ch):
        m = min(ch, n - s)
        w = read(m)
        if gauss._gk is not None:
            c = gauss._gk.fast(w, flat[s : s + m].numpy(), float(std), wt.numpy(), kt.numpy(), flags, rej)
            r = rej[:c]
        else:
            x, bad = gauss.fast(torch.from_numpy(w), float(std))
            flat[s : s + m].copy_(x)
            r = bad.nonzero().view(-1).numpy()
        if r.size:
            idx.append(r + s)
            cand.append(w[r])  # a copy (fancy indexing)
    if idx and gauss._gk is not None:  # NumPy only: no torch intra-op threads while rows run in threads
        vals = gauss.resolve_cpu(np.concatenate(cand), lambda m: read(3 * m).copy(), float(std))
        flat.numpy()[np.concatenate(idx)] = vals  # float64 -> out's dtype, rounded to nearest
    elif idx:
        i = torch.from_numpy(np.concatenate(idx))
        vals = gauss.resolve(torch.from_numpy(np.concatenate(cand)),
                             lambda todo: torch.from_numpy(read(3 * todo.numel()).copy()).view(-1, 3), float(std))
        flat.index_copy_(0, i, vals.to(out.dtype))
    return out


def gaussian_rows(rngs: list[CryptoRNG], out: torch.Tensor, std: float, threads: int | None = None) -> torch.Tensor:
    """Row r of `out` ([k, n], contiguous, float, any device) from rngs[r]'s stream, as
    `rngs[r].gaussian_into(out[r], std)`: rows in threads on the CPU, all rows at once on a device."""
    _check_std(std)
    if out.dim() != 2 or out.shape[0] != len(rngs) or not out.is_contiguous() or not out.dtype.is_floating_point:
        raise ValueError("gaussian_rows needs a contiguous float [len(rngs), n] tensor")
    if out.device.type != "cpu":
        from dpfl.rng.device import gaussian_rows as on_device

        return on_device(rngs, out, std)
    from dpfl.threads import for_each

    for_each(len(rngs), lambda r: rngs[r].gaussian_into(out[r], std), threads=threads)
    return out
