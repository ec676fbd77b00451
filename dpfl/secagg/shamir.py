"""Shamir t-of-n secret sharing over the prime field GF(p), p = 2^31 − 1, limb by limb.

A 32-byte secret is cut into L = 9 limbs of 30 bits; each limb s_j is the constant term of its
own random polynomial f_j of degree t − 1 over GF(p), and holder x (1 ≤ x < p) gets
(f_1(x), ..., f_L(x)). Any t shares give every limb by Lagrange interpolation at 0; any t − 1
shares are uniform and independent of the limbs (each limb is shared perfectly and the
polynomials are independent), so they reveal nothing about the secret. The small field keeps
everything in int64 numpy arithmetic: products of two elements are < 2^62.

`reconstruct` takes every share received, not just t: m shares of a degree-(t − 1) polynomial are a
Reed–Solomon codeword, so it checks all of them (parity checks of the code) and, if some are
wrong, corrects up to ⌊(m − t)/2⌋ of them (Berlekamp–Welch, limb by limb), naming their holders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache

import numpy as np

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import CryptoRNG

PRIME = (1 << 31) - 1  # Mersenne prime M31
LIMB_BITS = 30
SECRET_BYTES = 32
LIMBS = -(-8 * SECRET_BYTES // LIMB_BITS)  # 9
SHARE_BYTES = 4 * LIMBS  # 36


def _limbs(secret: bytes) -> np.ndarray:
    if len(secret) != SECRET_BYTES:
        raise ConfigError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    v = int.from_bytes(secret, "little")
    return np.array([(v >> (LIMB_BITS * j)) & ((1 << LIMB_BITS) - 1) for j in range(LIMBS)], dtype=np.int64)


def split(secret: bytes, t: int, holders: Iterable[int], rng: CryptoRNG) -> dict[int, bytes]:
    """Shares {x: 36 bytes} of a 32-byte `secret` for each holder x; any t of them reconstruct it."""
    xs = np.array(sorted({int(x) for x in holders}), dtype=np.int64)
    if xs.size == 0 or xs[0] < 1 or xs[-1] >= PRIME:
        raise ConfigError(f"share holders must be distinct integers in [1, {PRIME})")
    if not 1 <= t <= xs.size:
        raise ConfigError(f"threshold t must be in [1, {xs.size}] (number of holders), got {t}")
    coeffs = rng.randbelow((t - 1) * LIMBS, PRIME).reshape(t - 1, LIMBS)  # uniform in GF(p)
    acc = np.zeros((xs.size, LIMBS), dtype=np.int64)
    for c in coeffs[::-1]:  # Horner from the top coefficient; values stay < 2^62 + p
        acc = (acc * xs[:, None] + c) % PRIME
    acc = (acc * xs[:, None] + _limbs(secret)) % PRIME
    data = acc.astype("<u4")
    return {int(x): data[i].tobytes() for i, x in enumerate(xs)}


@lru_cache(maxsize=4096)
def _lagrange_at_zero(xs: tuple[int, ...]) -> np.ndarray:
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return np.array(out, dtype=np.int64)


def combine(shares: Mapping[int, bytes], t: int) -> bytes:
    """The 32-byte secret from at least t shares {x: share}; uses the t smallest holders."""
    if not isinstance(t, (int, np.integer)) or t < 1:
        raise ConfigError(f"threshold t must be an integer ≥ 1, got {t!r}")
    if len(shares) < t:
        raise ProtocolError(f"need {t} shares to reconstruct a secret, got {len(shares)}")
    xs = tuple(sorted(int(x) for x in shares)[:t])
    if xs[0] < 1 or xs[-1] >= PRIME:
        raise ProtocolError(f"share holder outside [1, {PRIME})")
    ys = np.stack([share_values(shares[x]) for x in xs])
    return _secret(((_lagrange_at_zero(xs)[:, None] * ys) % PRIME).sum(axis=0) % PRIME)


def reconstruct(shares: Mapping[int, bytes], t: int) -> tuple[bytes, frozenset[int]]:
    """(secret, holders whose shares are wrong) from m ≥ t shares {x: share}. All m shares are
    checked; up to ⌊(m − t)/2⌋ wrong ones are corrected and named. Raises `ProtocolError` when
    the shares are inconsistent and cannot be corrected (too many wrong, or too few to tell)."""
    if not isinstance(t, (int, np.integer)) or t < 1:
        raise ConfigError(f"threshold t must be an integer ≥ 1, got {t!r}")
    xs = tuple(sorted(int(x) for x in shares))
    if len(xs) < t:
        raise ProtocolError(f"need {t} shares to reconstruct a secret, got {len(xs)}")
    if xs[0] < 1 or xs[-1] >= PRIME:
        raise ProtocolError(f"share holder outside [1, {PRIME})")
    ys = np.stack([share_values(shares[x]) for x in xs])  # [m, LIMBS]
    if _consistent(xs, ys, t):
        return combine({x: shares[x] for x in xs[:t]}, t), frozenset()
    m, e = len(xs), (len(xs) - t) // 2
    if e == 0:
        raise ProtocolError(f"inconsistent shares: {m} shares for threshold {t} cannot locate the wrong ones")
    x = np.array(xs, dtype=np.int64)
    bad: set[int] = set()
    limbs = []
    for j in range(LIMBS):
        coeffs = _berlekamp_welch(x, ys[:, j], t, e)
        if coeffs is None:
            raise ProtocolError(f"inconsistent shares: more than {e} of {m} are wrong (threshold {t})")
        bad.update(xs[i] for i in np.nonzero(_evaluate(coeffs, x) != ys[:, j])[0])
        limbs.append(coeffs[0])
    if len(bad) > e:
        raise ProtocolError(f"inconsistent shares: more than {e} of {m} are wrong (threshold {t})")
    return _secret(np.array(limbs, dtype=np.int64)), frozenset(bad)


def _secret(limbs: np.ndarray) -> bytes:
    if (limbs >> LIMB_BITS).any():
        raise ProtocolError("inconsistent shares: a reconstructed limb is out of range")
    v = sum(int(limb) << (LIMB_BITS * j) for j, limb in enumerate(limbs))
    if v >> (8 * SECRET_BYTES):
        raise ProtocolError("inconsistent shares: the reconstructed secret is longer than 32 bytes")
    return v.to_bytes(SECRET_BYTES, "little")


@lru_cache(maxsize=1024)
def _parity_matrix(xs: tuple[int, ...], t: int) -> np.ndarray:
    """H [(m − t), m] with H·y = 0 (mod p) iff the m points (x_i, y_i) lie on a polynomial of degree
    < t: H[r, i] = x_i^r / Π_{k≠i}(x_i − x_k), the dual of the Reed–Solomon code."""
    x = np.array(xs, dtype=np.int64)
    m = x.size
    diff = (x[:, None] - x[None, :]) % PRIME
    np.fill_diagonal(diff, 1)
    while diff.shape[1] > 1:  # row products, pairwise
        if diff.shape[1] % 2:
            diff = np.concatenate([diff, np.ones((m, 1), dtype=np.int64)], axis=1)
        diff = diff[:, ::2] * diff[:, 1::2] % PRIME
    prod = diff[:, 0]
    h = np.empty((m - t, m), dtype=np.int64)
    if m > t:
        h[0] = [pow(int(a), -1, PRIME) for a in prod]
        for r in range(1, m - t):
            h[r] = h[r - 1] * x % PRIME
    return h


def _consistent(xs: tuple[int, ...], ys: np.ndarray, t: int) -> bool:
    h = _parity_matrix(xs, t)
    if not h.size:
        return True
    lo, hi = ys & 0xFFFF, ys >> 16  # H·y in two halves: each sum of m terms < 2^47 stays in int64
    return not ((((h @ hi) % PRIME) * 65536 + h @ lo) % PRIME).any()


def _evaluate(coeffs: list[int], x: np.ndarray) -> np.ndarray:
    acc = np.zeros_like(x)
    for c in reversed(coeffs):
        acc = (acc * x + c) % PRIME
    return acc


def _berlekamp_welch(x: np.ndarray, y: np.ndarray, t: int, e: int) -> list[int] | None:
    """Coefficients of the polynomial P of degree < t with P(x_i) = y_i for all but ≤ e points, or
    None. Solves Q(x_i) = y_i·E(x_i) for Q (degree < t + e) and monic E (degree e); P = Q / E."""
    powers = np.ones((x.size, t + e), dtype=np.int64)
    for k in range(1, t + e):
        powers[:, k] = powers[:, k - 1] * x % PRIME
    ex = powers[:, e]  # x^e
    a = np.concatenate([powers, (-(y[:, None] * powers[:, :e]) % PRIME) % PRIME], axis=1)
    sol = _solve(a, y * ex % PRIME)
    if sol is None:
        return None
    q, err = [int(v) for v in sol[: t + e]], [int(v) for v in sol[t + e :]] + [1]
    quot, rem = _divide(q, err)
    if any(rem) or len(quot) > t:
        return None
    return (quot + [0] * t)[:t]


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """One solution of a·s = b over GF(p) (free unknowns 0), or None if there is none."""
    m, n = a.shape
    mat = np.concatenate([a, b[:, None]], axis=1) % PRIME
    pivots, r = [], 0
    for c in range(n):
        if r == m:
            break
        nz = np.nonzero(mat[r:, c])[0]
        if not nz.size:
            continue
        i = r + int(nz[0])
        mat[[r, i]] = mat[[i, r]]
        mat[r] = mat[r] * pow(int(mat[r, c]), -1, PRIME) % PRIME
        f = mat[:, c].copy()
        f[r] = 0
        mat = (mat - f[:, None] * mat[r][None, :] % PRIME) % PRIME
        pivots.append(c)
        r += 1
    if mat[r:, n].any():
        return None
    sol = np.zeros(n, dtype=np.int64)
    for i, c in enumerate(pivots):
        sol[c] = mat[i, n]
    return sol


def _divide(num: list[int], den: list[int]) -> tuple[list[int], list[int]]:
    """Polynomial division over GF(p), coefficients lowest first; den is monic."""
    num = list(num)
    dn = len(den) - 1
    quot = [0] * max(len(num) - dn, 0)
    for k in range(len(num) - 1, dn - 1, -1):
        c = num[k]
        if c:
            quot[k - dn] = c
            for j in range(dn + 1):
                num[k - dn + j] = (num[k - dn + j] - c * den[j]) % PRIME
    while quot and quot[-1] == 0:
        quot.pop()
    return quot, num[:dn]


def share_values(share: bytes) -> np.ndarray:
    """A share's limb values, validated (length and field range)."""
    if not isinstance(share, (bytes, bytearray)) or len(share) != SHARE_BYTES:
        raise ProtocolError(f"a share must be {SHARE_BYTES} bytes")
    y = np.frombuffer(share, dtype="<u4").astype(np.int64)
    if (y >= PRIME).any():
        raise ProtocolError("share value outside the field GF(2^31 − 1)")
    return y
