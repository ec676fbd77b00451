"""Orthonormal DCT-II and the thesis compression operator C(x, m) (FL-CS, FL-FREQ).

`dct`/`idct` act on the last axis, in O(L log L): scipy.fft on CPU, a torch FFT formulation
(Makhoul's reordering) on other devices; both give the orthonormal DCT-II and its inverse.

`ChunkedDCT(n, m, chunks, perm)` is the scalable operator of thesis §4.1.4: the n coordinates
are permuted with a seed-shared permutation, laid out in P chunks of length L, and chunk j
keeps its first m_j DCT coefficients (Σ m_j = m). Deviations from the thesis text, forced by
integer sizes (documented here once):

* L = scipy.fft.next_fast_len(ceil(n / P)) (11-smooth): chunks are zero padded to an FFT-friendly length
  (a prime L such as 8317 is ~6× slower). Chunk j holds n_j ∈ {⌊n/P⌋, ⌈n/P⌉} real coordinates
  followed by L − n_j zeros. The padding never travels and the reconstruction pins it to 0.
* m_j ∈ {⌊m/P⌋, ⌈m/P⌉} (the first m mod P chunks get one more) so the wire carries exactly m
  values, m = ⌊r·n⌋ — the thesis cost formula.

With P = 1 and no permutation, `compress` is "the first m DCT coefficients" (FL-FREQ) of the
vector zero padded to a fast length. On the padded vector Θ = (rows kept) ∘ DCT has
orthonormal rows (ΘΘᵀ = I); `adjoint` (zero-fill, inverse DCT, drop padding) is Θᵀ and is
FL-FREQ's decoder.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft
import torch

from dpfl.errors import ConfigError, DataError


def _check_float(x: torch.Tensor) -> None:
    if x.dtype not in (torch.float32, torch.float64):
        raise DataError(f"DCT input must be float32 or float64, got {x.dtype}")


def dct(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II along the last axis."""
    _check_float(x)
    if x.device.type == "cpu":
        return torch.from_numpy(scipy.fft.dct(x.detach().numpy(), type=2, norm="ortho", axis=-1))
    return dct_torch(x)


def idct(c: torch.Tensor) -> torch.Tensor:
    """Inverse of `dct` (orthonormal DCT-III) along the last axis."""
    _check_float(c)
    if c.device.type == "cpu":
        return torch.from_numpy(scipy.fft.idct(c.detach().numpy(), type=2, norm="ortho", axis=-1))
    return idct_torch(c)


def _scale(n: int, like: torch.Tensor) -> torch.Tensor:
    s = torch.full((n,), math.sqrt(2.0 / n), dtype=like.dtype, device=like.device)
    s[0] = math.sqrt(1.0 / n)
    return s


def _twiddle(n: int, like: torch.Tensor, sign: float) -> torch.Tensor:
    k = torch.arange(n // 2 + 1, dtype=like.dtype, device=like.device)
    return torch.polar(torch.ones_like(k), sign * math.pi * k / (2 * n))


def dct_torch(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II via one real FFT (any device)."""
    n = x.shape[-1]
    v = torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)
    w = torch.fft.rfft(v, dim=-1) * _twiddle(n, x, -1.0)
    out = torch.cat([w.real, -w.imag[..., 1 : n - n // 2].flip(-1)], dim=-1)
    return out * _scale(n, x)


def idct_torch(c: torch.Tensor) -> torch.Tensor:
    """Inverse of `dct_torch` via one inverse real FFT (any device)."""
    n = c.shape[-1]
    u = c / _scale(n, c)
    h = n // 2 + 1
    rev = torch.zeros_like(u[..., :h])  # X_{n-k} for k = 0..n//2, with X_n = 0
    rev[..., 1:] = u[..., n - n // 2 :].flip(-1)
    w = torch.complex(u[..., :h], -rev) * _twiddle(n, c, 1.0)
    v = torch.fft.irfft(w, n=n, dim=-1)
    out = torch.empty_like(v)
    half = (n + 1) // 2
    out[..., ::2] = v[..., :half]
    out[..., 1::2] = v[..., half:].flip(-1)
    return out


def _split(total: int, parts: int) -> np.ndarray:
    """`total` split into `parts` near-equal integers, larger ones first."""
    base, extra = divmod(total, parts)
    return np.full(parts, base, dtype=np.int64) + (np.arange(parts) < extra)


class ChunkedDCT:
    """C(x, m): permute, chunk, keep the first m_j orthonormal DCT-II coefficients per chunk.

    Compressed vectors are flat [..., m], chunk by chunk. Batched over any leading axes.
    """

    def __init__(self, n: int, m: int, chunks: int = 1, perm: np.ndarray | None = None):
        if n < 1:
            raise ConfigError(f"n must be a positive number of parameters, got {n}")
        if not 1 <= m <= n:
            raise ConfigError(f"m must be in [1, n={n}], got {m}")
        if not 1 <= chunks <= m:
            raise ConfigError(f"chunks P must be in [1, m={m}] (each chunk keeps ≥ 1 coefficient), got {chunks}")
        if perm is not None:
            perm = np.asarray(perm)
            if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
                raise ConfigError(f"perm must be a permutation of range({n})")
        self.n, self.m, self.chunks = int(n), int(m), int(chunks)
        self.length = scipy.fft.next_fast_len(-(-n // chunks))
        self.real_counts = _split(n, chunks)
        self.counts = _split(m, chunks)
        L = self.length
        rows = np.repeat(np.arange(chunks), self.real_counts)
        cols = np.arange(n) - np.repeat(np.cumsum(self.real_counts) - self.real_counts, self.real_counts)
        slots = rows * L + cols  # buffer slot of the t-th permuted coordinate
        place = np.empty(n, dtype=np.int64)
        place[perm if perm is not None else np.arange(n)] = slots
        krows = np.repeat(np.arange(chunks), self.counts)
        kcols = np.arange(m) - np.repeat(np.cumsum(self.counts) - self.counts, self.counts)
        self._place = torch.from_numpy(place)
        self._keep = torch.from_numpy(krows * L + kcols)
        self._cache: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def _idx(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if device not in self._cache:
            shape = (self.chunks, self.length)
            measured = torch.zeros(self.chunks * self.length, dtype=torch.bool)
            measured[self._keep] = True
            real = torch.zeros(self.chunks * self.length, dtype=torch.bool)
            real[self._place] = True
            self._cache[device] = (
                self._place.to(device),
                self._keep.to(device),
                measured.view(shape).to(device),
                real.view(shape).to(device),
            )
        return self._cache[device]

    def masks(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(measured, real): bool [P, L] — kept DCT coefficients, and slots holding real coordinates."""
        return self._idx(torch.device(device))[2:]

    def _check(self, x: torch.Tensor, d: int, what: str) -> None:
        _check_float(x)
        if x.shape[-1] != d:
            raise DataError(f"{what} must have last dimension {d}, got shape {tuple(x.shape)}")

    def to_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] → [..., P, L] (permuted, zero padded)."""
        self._check(x, self.n, "input")
        flat = x.reshape(-1, self.n)
        buf = flat.new_zeros(flat.shape[0], self.chunks * self.length)
        buf.index_copy_(1, self._idx(x.device)[0], flat)
        return buf.view(*x.shape[:-1], self.chunks, self.length)

    def from_chunks(self, c: torch.Tensor) -> torch.Tensor:
        """[..., P, L] → [..., n] (drops padding, undoes the permutation)."""
        flat = c.reshape(-1, self.chunks * self.length)
        return torch.index_select(flat, 1, self._idx(c.device)[0]).view(*c.shape[:-2], self.n)

    def expand(self, y: torch.Tensor) -> torch.Tensor:
        """[..., m] compressed → [..., P, L] DCT coefficients, zero where not measured."""
        self._check(y, self.m, "compressed input")
        flat = y.reshape(-1, self.m)
        c = flat.new_zeros(flat.shape[0], self.chunks * self.length)
        c.index_copy_(1, self._idx(y.device)[1], flat)
        return c.view(*y.shape[:-1], self.chunks, self.length)

    def select(self, c: torch.Tensor) -> torch.Tensor:
        """[..., P, L] DCT coefficients → [..., m] measured ones."""
        flat = c.reshape(-1, self.chunks * self.length)
        return torch.index_select(flat, 1, self._idx(c.device)[1]).view(*c.shape[:-2], self.m)

    def compress(self, x: torch.Tensor, block: int = 8) -> torch.Tensor:
        """C(x, m): [..., n] → [..., m]; rows are processed `block` at a time to bound memory."""
        self._check(x, self.n, "input")
        flat = x.reshape(-1, self.n)
        out = torch.cat([self.select(dct(self.to_chunks(flat[i : i + block]))) for i in range(0, flat.shape[0], block)])
        return out.view(*x.shape[:-1], self.m)

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """Θᵀy: [..., m] → [..., n] (zero-filled inverse DCT; FL-FREQ's decoder)."""
        return self.from_chunks(idct(self.expand(y)))
