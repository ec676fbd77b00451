"""Shamir t-of-n secret sharing over the prime field GF(p), p = 2^31 − 1, limb by limb.

A 32-byte secret is cut into L = 9 limbs of 30 bits; each limb s_j is the constant term of its
own random polynomial f_j of degree t − 1 over GF(p), and holder x (1 ≤ x < p) gets
(f_1(x), ..., f_L(x)). Any t shares give every limb by Lagrange interpolation at 0; any t − 1
shares are uniform and independent of the limbs (each limb is shared perfectly and the
polynomials are independent), so they reveal nothing about the secret. The small field keeps
everything in int64 numpy arithmetic: products of two elements are < 2^62.
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
    limbs = ((_lagrange_at_zero(xs)[:, None] * ys) % PRIME).sum(axis=0) % PRIME
    if (limbs >> LIMB_BITS).any():
        raise ProtocolError("inconsistent shares: a reconstructed limb is out of range")
    v = sum(int(limb) << (LIMB_BITS * j) for j, limb in enumerate(limbs))
    if v >> (8 * SECRET_BYTES):
        raise ProtocolError("inconsistent shares: the reconstructed secret is longer than 32 bytes")
    return v.to_bytes(SECRET_BYTES, "little")


def share_values(share: bytes) -> np.ndarray:
    """A share's limb values, validated (length and field range)."""
    if not isinstance(share, (bytes, bytearray)) or len(share) != SHARE_BYTES:
        raise ProtocolError(f"a share must be {SHARE_BYTES} bytes")
    y = np.frombuffer(share, dtype="<u4").astype(np.int64)
    if (y >= PRIME).any():
        raise ProtocolError("share value outside the field GF(2^31 − 1)")
    return y
