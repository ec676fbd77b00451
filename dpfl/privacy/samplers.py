"""Lattice samplers: exact discrete Gaussian (real mean) and discrete Laplace, and fast
table samplers for large integer-mean arrays with a stated total-variation bound.

Exact samplers (Canonne-Kamath-Steinke 2020, Algorithms 1-3) use only uniform integers and
rational arithmetic (``fractions.Fraction``). For a real mean mu the proposal is
c + Lap_Z(t), c = round(mu), t = floor(sigma) + 1, accepted with probability
exp(-[(y-mu)^2/(2 sigma^2) - |y-c|/t + |mu-c|/t + sigma^2/(2t^2)]) (exponent >= 0 by
(y-mu)^2 >= (|y-c| - |mu-c|)^2; with mu = c it is CKS20's Algorithm 3).

Fast samplers: inverse CDF of the noise on [-K, K] with every CDF boundary stored exactly as
a 128-bit integer; a two-level lookup table on one 32-bit word decides almost every sample,
the rest are resolved exactly against the 128-bit CDF (see ``_Table``). Distance from the
exact distribution, per sample:
TV <= tail mass beyond K (<= 2^-140 by the choice of K) + (2K+1) 2^-127 (rounding).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import numpy as np

from dpfl.errors import PrivacyError
from dpfl.rng import CryptoRNG
from dpfl.rng.kernel import c_kernel

_FIX = 200  # fixed-point bits of the weights
_TAIL_LOG2 = -140  # tail-mass target, log2
_SENT = np.iinfo(np.int32).min
_CHUNK = 1 << 18
_MAX_SUPPORT = 1 << 23


# ---- random sources ---------------------------------------------------------------------


class Source:
    """Uniform bits from a numpy Generator or a CryptoRNG, one interface."""

    def __init__(self, rng):
        if not isinstance(rng, (np.random.Generator, CryptoRNG)):
            raise PrivacyError(
                f"rng must be a numpy Generator or a dpfl.rng.CryptoRNG, got {type(rng).__name__}"
            )
        self.rng = rng
        self.crypto = isinstance(rng, CryptoRNG)

    def bytes(self, n: int) -> bytes:
        return self.rng.bytes(n)

    def uint32(self, n: int) -> np.ndarray:
        if self.crypto:
            return np.frombuffer(self.rng.bytes(4 * n), dtype="<u4")
        return self.rng.integers(0, 1 << 32, size=n, dtype=np.uint32)

    def words32_reader(self, chunk: int):
        """f(m) -> the next m uint32 words, as `uint32(m)` gives them (from a CryptoRNG: a view of a
        buffer reused up to `chunk` words, valid until the next call)."""
        return self.rng.words32_reader(chunk) if self.crypto else self.uint32

    def uint64(self, n: int) -> np.ndarray:
        if self.crypto:
            return np.frombuffer(self.rng.bytes(8 * n), dtype="<u8")
        return self.rng.integers(0, 1 << 64, size=n, dtype=np.uint64)

    def uniform_open(self, n: int) -> np.ndarray:
        """Uniform floats in (0, 1): (k + 1/2) / 2^53 for a uniform 53-bit k."""
        return ((self.uint64(n) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53

    def randbelow(self, n: int) -> int:
        """Exact uniform integer in [0, n) (rejection sampling on whole bytes)."""
        if n == 1:
            return 0
        bits = (n - 1).bit_length()
        nbytes, mask = (bits + 7) // 8, (1 << bits) - 1
        while True:
            x = int.from_bytes(self.rng.bytes(nbytes), "little") & mask
            if x < n:
                return x


def source(rng, secure: bool) -> Source:
    """``secure=True``: a CryptoRNG keyed from the OS (or the CryptoRNG given); never weaker."""
    if secure:
        if rng is None:
            return Source(CryptoRNG())
        if not isinstance(rng, CryptoRNG):
            raise PrivacyError(
                f"secure=True needs rng=None (OS-keyed CryptoRNG) or a CryptoRNG, got {type(rng).__name__}"
            )
        return Source(rng)
    if rng is None:
        raise PrivacyError("pass rng= (a numpy Generator or a dpfl.rng.CryptoRNG) or secure=True")
    return Source(rng)


def _positive_fraction(name: str, v) -> Fraction:
    if isinstance(v, bool) or not isinstance(v, (int, float, Fraction)) or not math.isfinite(v) or v <= 0:
        raise PrivacyError(f"{name} must be a finite number > 0, got {v!r}")
    return Fraction(v)


# ---- exact samplers (CKS20) --------------------------------------------------------------


def _bernoulli(src: Source, p: Fraction) -> bool:
    return src.randbelow(p.denominator) < p.numerator


def _bernoulli_exp(src: Source, gamma: Fraction) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS20 Algorithm 1)."""
    while gamma > 1:
        if not _bernoulli_exp(src, Fraction(1)):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(src, gamma / k):
        k += 1
    return k % 2 == 1


def _discrete_laplace_int(src: Source, s: int, t: int) -> int:
    """pmf proportional to exp(-|x| s / t) on the integers (CKS20 Algorithm 2)."""
    while True:
        u = src.randbelow(t)
        if not _bernoulli_exp(src, Fraction(u, t)):
            continue
        v = 0
        while _bernoulli_exp(src, Fraction(1)):
            v += 1
        y = (u + t * v) // s
        b = src.randbelow(2)
        if b == 1 and y == 0:
            continue
        return (1 - 2 * b) * y


def _dg_exact_one(src: Source, mu: Fraction, s2: Fraction, t: int) -> int:
    c = round(mu)
    r = abs(mu - c)
    while True:
        d = _discrete_laplace_int(src, 1, t)
        y = c + d
        gamma = (y - mu) ** 2 / (2 * s2) - Fraction(abs(d), t) + r / t + s2 / (2 * t * t)
        if _bernoulli_exp(src, gamma):
            return y


def discrete_gaussian_exact(mu, sigma, rng=None, *, size=None, secure: bool = False):
    """Exact DG(mu, sigma): pmf proportional to exp(-(x-mu)^2/(2 sigma^2)) on the integers.

    ``mu`` and ``sigma`` (float, int or Fraction) are used exactly. Returns an int, or an
    int64 array of shape ``size``. Slow (pure Python): the reference sampler.
    """
    src = source(rng, secure)
    if isinstance(mu, bool) or not isinstance(mu, (int, float, Fraction)) or not math.isfinite(mu):
        raise PrivacyError(f"mu must be a finite real number, got {mu!r}")
    mu_f, sig = Fraction(mu), _positive_fraction("sigma", sigma)
    t = math.floor(sig) + 1
    if size is None:
        return _dg_exact_one(src, mu_f, sig * sig, t)
    n = int(np.prod(size))
    return np.array([_dg_exact_one(src, mu_f, sig * sig, t) for _ in range(n)], dtype=np.int64).reshape(size)


def discrete_laplace_exact(scale, rng=None, *, size=None, secure: bool = False):
    """Exact discrete Laplace noise: pmf proportional to exp(-|x|/scale) on the integers."""
    src = source(rng, secure)
    b = _positive_fraction("scale", scale)
    if size is None:
        return _discrete_laplace_int(src, b.denominator, b.numerator)
    n = int(np.prod(size))
    out = [_discrete_laplace_int(src, b.denominator, b.numerator) for _ in range(n)]
    return np.array(out, dtype=np.int64).reshape(size)


# ---- fast table samplers -----------------------------------------------------------------


def _dec(fr: Fraction) -> Decimal:
    return Decimal(fr.numerator) / Decimal(fr.denominator)


def _fixed_exp(neg_exponent: Fraction) -> int:
    """floor(exp(-x) * 2^_FIX) for rational x >= 0, via 90-digit decimals."""
    with localcontext() as ctx:
        ctx.prec = 90
        return int((-_dec(neg_exponent)).exp() * (Decimal(2) ** _FIX))


class _Table:
    """Exact-CDF lookup table for a symmetric pmf on [-K, K] given by fixed-point weights.

    Level 1: the top B bits of a 32-bit word pick a cell; a cell without a CDF boundary
    inside gives the value. Level 2: a cell with one boundary compares the word's low
    L = 32 - B bits with the boundary's next L bits. Ties and cells with several boundaries
    go to the exact path: the word plus 96 fresh bits against the 128-bit CDF.
    """

    MULTI, SINGLE = _SENT, _SENT + 1

    def __init__(self, half: list[int], tail: float):
        # half[k] = weight of |x| = k (k = 0..K), fixed point
        K = len(half) - 1
        w = half[:0:-1] + half  # x = -K..K
        n, one, Z = len(w), 1 << 128, sum(w)
        mass = [(x << 128) // Z for x in w]
        mass[K] += one - sum(mass)  # rounding remainder on the mode
        cdf, acc = [], 0
        for m in mass[:-1]:
            acc += m
            cdf.append(acc)  # boundaries C_1..C_{n-1}: output = #{k : C_k <= u}
        B = min(20, max(8, (n - 1).bit_length() + 3))
        L, sh = 32 - B, 128 - B
        cells = np.arange(1 << B)
        ceil_cells = np.array([(c + (1 << sh) - 1) >> sh for c in cdf], dtype=np.int64)
        floor_cells = np.array([c >> sh for c in cdf], dtype=np.int64)
        lo = (np.searchsorted(ceil_cells, cells, side="right") - K).astype(np.int32)  # atom at cell start
        hi = (np.searchsorted(floor_cells, cells, side="right") - K).astype(np.int32)  # atom at cell end
        lut, thr = lo.copy(), np.zeros(1 << B, dtype=np.uint32)
        inside: dict[int, set[int]] = {}
        for c in cdf:
            if c < one and c & ((1 << sh) - 1):
                inside.setdefault(c >> sh, set()).add(c)
        for cell, cs in inside.items():
            if len(cs) == 1:  # one boundary value (possibly shared by zero-mass atoms)
                lut[cell], thr[cell] = self.SINGLE, (next(iter(cs)) >> (sh - L)) & ((1 << L) - 1)
            else:
                lut[cell] = self.MULTI
        self.K, self.B, self.L, self.lut, self.thr, self.lo, self.hi = K, B, L, lut, thr, lo, hi
        live = [c for c in cdf if c < one]  # boundaries at 2^128 (zero-mass tail atoms) never fire
        self.c_hi = np.array([c >> 64 for c in live], dtype=np.uint64)
        self.c_lo = np.array([c & ((1 << 64) - 1) for c in live], dtype=np.uint64)
        self.tv = tail * (1 + 1e-9) + n * 2.0**-127
        self._dev: dict = {}

    def _exact(self, words: np.ndarray, r: np.ndarray, r2: np.ndarray) -> np.ndarray:
        """Exact output for u = word (32 known top bits) . 96 more bits: r (64) then r2 (32) per word."""
        r2 = r2.astype(np.uint64)
        u_hi = (words.astype(np.uint64) << np.uint64(32)) | (r >> np.uint64(32))
        u_lo = ((r & np.uint64(0xFFFFFFFF)) << np.uint64(32)) | r2
        left = np.searchsorted(self.c_hi, u_hi, side="left")
        right = np.searchsorted(self.c_hi, u_hi, side="right")
        atom = left.astype(np.int64)
        for i in np.flatnonzero(right > left):  # equal top 64 bits: compare the low 64 (p ~ 2^-64)
            atom[i] += int(np.count_nonzero(self.c_lo[left[i] : right[i]] <= u_lo[i]))
        return atom - self.K

    def lookup(self, w, xp):
        """Values for 32-bit words w (numpy uint32 array or torch int64 tensor), the exact cases
        left as a mask: (values, exact). xp: numpy or torch (the tables as that library's arrays)."""
        lut, thr, lo, hi = self.arrays(xp, w)
        h = w >> self.L
        v = lut[h]
        special = v < -self.K  # SINGLE or MULTI cells: one pass
        exact = special & False
        if bool(special.any()):
            hs, ul = h[special], w[special] & ((1 << self.L) - 1)
            t = thr[hs]
            v[special] = xp.where(ul < t, lo[hs], hi[hs])
            exact[special] = (lut[hs] == self.MULTI) | (ul == t)
        return v, exact

    def arrays(self, xp, like):
        if xp is np:
            return self.lut, self.thr, self.lo, self.hi
        key = str(like.device)
        if key not in self._dev:
            import torch

            self._dev[key] = tuple(torch.from_numpy(a.astype(np.int64)).to(like.device)
                                   for a in (self.lut, self.thr, self.lo, self.hi))
        return self._dev[key]

    def sample_into(self, out: np.ndarray, src: Source, mean=None, kernel: bool = True) -> None:
        """Fill 1-D int64 ``out`` with mean + noise (mean: None, an int or an int array like out).
        One 32-bit word per value; the rare exact cases (in index order) then take 64 + 32 more bits
        each, from the words after all n (all their 64-bit words, then all their 32-bit words).
        kernel=False: the lookup in NumPy even where the C kernel is built (the same values)."""
        idx, words = [], []
        gk = _kernel() if kernel and out.flags.c_contiguous else None
        if gk is not None:  # the C kernel's lookup: the same values and exact cases, one pass
            ri, rw = np.empty(min(_CHUNK, out.size), np.int64), np.empty(min(_CHUNK, out.size), np.uint32)
        read = src.words32_reader(_CHUNK)
        for s in range(0, out.size, _CHUNK):
            e = min(s + _CHUNK, out.size)
            w = read(e - s)
            if gk is not None:
                m = gk.dg_lookup(np.ascontiguousarray(w), self.lut, self.thr, self.lo, self.hi, self.K, self.L,
                                 out[s:e], ri, rw, s)
                if m:
                    idx.append(ri[:m].copy())
                    words.append(rw[:m].copy())
                continue
            v, exact = self.lookup(w, np)
            if exact.any():
                idx.append(np.flatnonzero(exact) + s)
                words.append(w[exact])
            out[s:e] = v
        if idx:
            i, ws = np.concatenate(idx), np.concatenate(words)
            out[i] = self._exact(ws, src.uint64(ws.size), src.uint32(ws.size))
        if mean is not None:
            out += mean


def _kernel():
    """The C lookup (`dpfl.rng.c_kernel`; without torch), or None where it is not built."""
    return c_kernel()


def _support(name: str, K: int) -> int:
    if 2 * K + 1 > _MAX_SUPPORT:
        raise PrivacyError(
            f"{name}: table support 2K+1 = {2 * K + 1} exceeds {_MAX_SUPPORT}; "
            "use the exact sampler for such a large scale"
        )
    return K


@lru_cache(maxsize=16)
def _gaussian_table(sigma: float) -> _Table:
    from scipy.special import log_ndtr  # here: see dpfl.privacy.rdp

    s = Fraction(sigma)
    # tail: P(|X| > K) <= 2 sum_{x>K} e^{-x^2/2s^2} / Z <= 2 sqrt(2 pi) sigma Phi(-K/sigma), Z >= 1
    log_tail = lambda K: math.log(2 * math.sqrt(2 * math.pi) * sigma) + log_ndtr(-K / sigma)
    K = max(1, math.ceil(sigma * math.sqrt(-2 * _TAIL_LOG2 * math.log(2))) - 2)
    while log_tail(K) > _TAIL_LOG2 * math.log(2):
        K += 1
    _support(f"discrete_gaussian(sigma={sigma})", K)
    a = _fixed_exp(1 / (2 * s * s))  # e^{-1/(2 s^2)}
    b = _fixed_exp(1 / (s * s))  # e^{-1/s^2}
    half, w, c = [1 << _FIX], 1 << _FIX, a  # w(k)/w(k-1) = e^{-(2k-1)/(2 s^2)} = a b^(k-1)
    for _ in range(K):
        w = (w * c) >> _FIX
        c = (c * b) >> _FIX
        half.append(w)
    return _Table(half, math.exp(log_tail(K)))


@lru_cache(maxsize=16)
def _laplace_table(scale: float) -> _Table:
    # tail: 2 sum_{x>K} r^x / Z <= 2 r^(K+1) / (1 - r), Z >= 1
    log_tail = lambda K: math.log(2) - (K + 1) / scale - math.log(-math.expm1(-1 / scale))
    K = max(1, math.ceil(scale * (-_TAIL_LOG2 * math.log(2))))
    while log_tail(K) > _TAIL_LOG2 * math.log(2):
        K += 1
    _support(f"discrete_laplace(scale={scale})", K)
    rf = _fixed_exp(1 / Fraction(scale))
    half, w = [1 << _FIX], 1 << _FIX
    for _ in range(K):
        w = (w * rf) >> _FIX
        half.append(w)
    return _Table(half, math.exp(log_tail(K)))


def _check_scale(name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PrivacyError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def sampler_tv_bound(sigma: float) -> float:
    """Per-sample total-variation distance of ``discrete_gaussian`` from the exact DG(mu, sigma)."""
    return _gaussian_table(_check_scale("sigma", sigma)).tv


def discrete_laplace_tv_bound(scale: float) -> float:
    """Per-sample total-variation distance of ``discrete_laplace`` from the exact distribution."""
    return _laplace_table(_check_scale("scale", scale)).tv


def _fast(table: _Table, mu, size, src: Source) -> np.ndarray:
    if size is not None:
        if not isinstance(mu, (int, np.integer)) or isinstance(mu, bool):
            raise PrivacyError("with size=..., mu must be a single integer")
        out = np.empty(size, dtype=np.int64)
        table.sample_into(out.reshape(-1), src, int(mu) if mu else None)
        return out
    m = np.asarray(mu)
    if m.dtype.kind not in "iu":
        raise PrivacyError(
            f"mu must be integers (got dtype {m.dtype}); use discrete_gaussian_exact for real means"
        )
    out = np.empty(m.shape, dtype=np.int64)
    table.sample_into(out.reshape(-1), src, m.reshape(-1) if m.ndim else int(m))
    return out


def discrete_gaussian(mu, sigma: float, rng=None, *, size=None, secure: bool = False) -> np.ndarray:
    """mu + DG(0, sigma) noise for an integer array ``mu`` (or ``size`` draws around an int mu).

    Fast table sampler; its distance from exact is ``sampler_tv_bound(sigma)`` per sample.
    """
    table = _gaussian_table(_check_scale("sigma", sigma))
    return _fast(table, mu, size, source(rng, secure))


def discrete_laplace(mu, scale: float, rng=None, *, size=None, secure: bool = False) -> np.ndarray:
    """mu + discrete Laplace noise (pmf proportional to exp(-|x|/scale)); integer ``mu``."""
    table = _laplace_table(_check_scale("scale", scale))
    return _fast(table, mu, size, source(rng, secure))


def discrete_gaussian_rows(mu, sigma: float, rngs: list):
    """Row r of the result: ``discrete_gaussian(mu[r], sigma, rngs[r])`` (the same values, the
    same stream positions after), computed where the integer tensor ``mu`` [k, n] is. The table
    lookups run on its device; the rare exact cases (about 1e-4 of values) are resolved on the CPU."""
    return _rows_tensor(mu, sigma, rngs, host=mu.device.type == "cpu")


def _rows_tensor(mu, sigma: float, rngs: list, host: bool):
    """`discrete_gaussian_rows` in tensor ops on mu's device (host=True: every row by the CPU sampler)."""
    import torch

    from dpfl.rng.chacha import words32_rows

    table = _gaussian_table(_check_scale("sigma", sigma))
    k, n = mu.shape
    if len({id(g) for g in rngs}) != len(rngs):  # rows run in threads: one stream twice would race
        raise PrivacyError("discrete_gaussian_rows: each row needs a generator of its own (one appears twice)")
    dev = mu.device
    out = torch.empty(k, n, dtype=torch.int64, device=dev)
    odd = [r for r, g in enumerate(rngs) if g.position % 4 or host]

    def row(j: int) -> None:  # on the CPU (or a stream not at a 32-bit boundary): the CPU sampler
        r = odd[j]
        out[r] = torch.from_numpy(discrete_gaussian(mu[r].cpu().numpy().astype(np.int64), sigma, rngs[r])).to(dev)

    from dpfl.threads import for_each

    for_each(len(odd), row)  # each row from its own stream: the same values on any number of threads
    todo = [r for r in range(k) if r not in set(odd)]
    if not todo or n == 0:
        return out
    keys = torch.tensor([rngs[r].key_words() for r in todo], dtype=torch.int64, device=dev)
    start = torch.tensor([rngs[r].position // 4 for r in todo], dtype=torch.int64, device=dev)
    w = words32_rows(keys, start, n)
    v, exact = table.lookup(w, torch)
    rows, idx = exact.nonzero(as_tuple=True)
    counts = torch.bincount(rows, minlength=len(todo))
    if rows.numel():
        ext = words32_rows(keys, start + n, 3 * int(counts.max()))
        rank = torch.arange(rows.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[rows]
        r64 = ext[rows, 2 * rank] | (ext[rows, 2 * rank + 1] << 32)  # < 2^64: as uint64 on the host
        r32 = ext[rows, 2 * counts[rows] + rank]
        vals = table._exact(w[rows, idx].cpu().numpy().astype(np.uint32), r64.cpu().numpy().view(np.uint64),
                            r32.cpu().numpy().astype(np.uint32))
        v[rows, idx] = torch.from_numpy(vals).to(dev)
    sel = torch.tensor(todo, device=dev)
    out[sel] = v + mu[sel].to(torch.int64)
    for r, m in zip(todo, counts.tolist()):
        rngs[r].advance(4 * n + 12 * m)
    return out
