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
import threading
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
        return gaussian_cpu(self.words_reader(_scratch("words", 8 * _CHUNK + 15, np.uint8)), out, std)

    def words_reader(self, buf: np.ndarray | None = None):
        """f(m) -> the next m 64-bit words as int64 (a view of a reused buffer up to _CHUNK words:
        `buf`, uint8, 64-byte aligned, 8 * _CHUNK + 15 bytes or more, else a new one)."""
        zeros = _zeros(8 * _CHUNK)
        if buf is None:
            buf = _aligned(8 * _CHUNK + 15)  # update_into wants block size - 1 spare bytes
        words = buf[: min(8 * _CHUNK, (buf.size - 15) // 8 * 8)].view(np.int64)

        def read(m: int) -> np.ndarray:
            if m > words.size:
                return self.uint64(m).view(np.int64)
            self._fill(zeros[: 8 * m], buf)
            return words[:m]

        return read

    def uint32(self, n: int) -> np.ndarray:
        return np.frombuffer(self.bytes(4 * n), dtype="<u4").copy()

    def words32_reader(self, chunk: int):
        """f(m) -> the next m 32-bit words (uint32, the same bytes as `uint32(m)`): a view of one
        buffer reused up to `chunk` words, else a new array."""
        zeros = _zeros(4 * chunk)
        buf = _aligned(4 * chunk + 15)  # update_into wants block size - 1 spare bytes
        words = buf[: 4 * chunk].view("<u4")

        def read(m: int) -> np.ndarray:
            if m > chunk:
                return self.uint32(m)
            self._fill(zeros[: 4 * m], buf)
            return words[:m]

        return read


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


_zero_bytes = np.zeros(0, dtype=np.uint8)


def _zeros(nbytes: int) -> np.ndarray:
    """Read-only zero bytes (what the keystream is XORed onto), one array shared by all draws."""
    global _zero_bytes
    z = _zero_bytes
    if z.size < nbytes:
        z = np.zeros(nbytes, dtype=np.uint8)
        z.setflags(write=False)
        _zero_bytes = z
    return z[:nbytes]


def _aligned(nbytes: int) -> np.ndarray:
    """An uninitialized byte buffer starting at a 64-byte boundary (whole cache lines for the
    vector loads of the C kernel; NumPy only promises 16)."""
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip : skip + nbytes]


_local = threading.local()


def _scratch(name: str, size: int, dtype=np.int64, keep: int = 0) -> np.ndarray:
    """This thread's array `name`, 64-byte aligned, of `size` items or more, reused from draw to
    draw (a new large array costs a page fault per 4 KiB each time); grown as needed, keeping its
    first `keep` items. What is in it is whatever the last user left there."""
    a = getattr(_local, name, None)
    if a is None or a.size < size:
        old, size = a, max(size, 2 * a.size if a is not None else 0)
        a = _aligned(size * np.dtype(dtype).itemsize).view(dtype)
        if keep:
            a[:keep] = old[:keep]
        setattr(_local, name, a)
    return a


def _check_std(std: float) -> None:
    if not (isinstance(std, (int, float)) and math.isfinite(std) and std >= 0):
        raise ValueError(f"Gaussian std must be >= 0 and finite, got {std}")


def gaussian_cpu(read, out, std: float):
    """Fill the contiguous CPU float tensor `out` from the word reader `read(m)` (the next m words
    as int64): keystream in cache-sized chunks through the fast path, then the rejected candidates
    resolved from the words that follow (`gauss.resolve`). The C kernel (where built) writes float32
    and float64 values straight into `out`; the torch ops give the same values, and other dtypes."""
    import torch

    from dpfl.rng import gauss

    std, n = float(std), out.numel()
    if gauss._gk is None or out.dtype not in (torch.float32, torch.float64):
        return _gaussian_torch(read, out, std)
    o = out.view(-1).numpy()
    wt, kt, _ = gauss.np_tables()
    ch = min(_CHUNK, n) or 1
    got = 0  # rejected so far: their indices and words, appended to this thread's scratch arrays
    ri, rw = _scratch("rej_idx", n // 32 + ch), _scratch("rej_words", n // 32 + ch)  # ~1.5 % expected
    for s in range(0, n, ch):
        m = min(ch, n - s)
        if got + m > ri.size:  # room for a whole chunk of rejects
            ri, rw = _scratch("rej_idx", got + m, keep=got), _scratch("rej_words", got + m, keep=got)
        got += gauss._gk.fast(read(m), o[s : s + m], std, wt, kt, ri[got:], rw[got:], s)
    if got:  # NumPy only: no torch intra-op threads while rows run in threads
        gauss.resolve_into(o, ri[:got], rw[:got], read, std)
    return out


def _gaussian_torch(read, out, std: float):
    """`gaussian_cpu` in torch ops (no C kernel, or a dtype it does not write)."""
    import torch

    from dpfl.rng import gauss

    flat, n = out.view(-1), out.numel()
    ch = min(_CHUNK, n) or 1
    idx, cand = [], []
    for s in range(0, n, ch):
        m = min(ch, n - s)
        w = read(m)
        x, bad = gauss.fast(torch.from_numpy(w), std)
        flat[s : s + m].copy_(x)
        r = bad.nonzero().view(-1).numpy()
        if r.size:
            idx.append(r + s)
            cand.append(w[r])  # a copy (fancy indexing)
    if idx:
        i = torch.from_numpy(np.concatenate(idx))
        vals = gauss.resolve(torch.from_numpy(np.concatenate(cand)),
                             lambda todo: torch.from_numpy(read(3 * todo.numel()).copy()).view(-1, 3), std)
        flat.index_copy_(0, i, vals.to(out.dtype))
    return out


def gaussian_rows(rngs: list[CryptoRNG], out: torch.Tensor, std: float, threads: int | None = None) -> torch.Tensor:
    """Row r of `out` ([k, n], contiguous, float, any device) from rngs[r]'s stream, as
    `rngs[r].gaussian_into(out[r], std)`: rows in threads on the CPU, all rows at once on a device."""
    _check_std(std)
    if out.dim() != 2 or out.shape[0] != len(rngs) or not out.is_contiguous() or not out.dtype.is_floating_point:
        raise ValueError("gaussian_rows needs a contiguous float [len(rngs), n] tensor")
    if len({id(g) for g in rngs}) != len(rngs):  # rows run in threads: one stream twice would race
        raise ValueError("gaussian_rows: each row needs a generator of its own (one appears twice)")
    if out.device.type != "cpu":
        from dpfl.rng.device import gaussian_rows as on_device

        return on_device(rngs, out, std)
    from dpfl.threads import for_each

    for_each(len(rngs), lambda r: rngs[r].gaussian_into(out[r], std), threads=threads)
    return out
