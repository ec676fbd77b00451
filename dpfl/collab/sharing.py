"""Additive secret sharing over the ring Z_(2^64) with fixed-point encoding (reference note B1.2).

    encode(v) = round(v · 2^f) mod 2^64          (negatives wrap: two's complement)
    share(x)  = (r_1, ..., r_(K-1), x − Σ r_i)   r_i uniform in Z_(2^64) (CryptoRNG)
    reconstruct(shares) = Σ shares mod 2^64

Any K−1 shares are uniform and independent of x; addition is share-wise. `secure_sum` runs
the protocol FedCollabNN uses among K workers and one aggregator: worker k splits its value
into K shares and sends share j to worker j; every worker adds the shares it holds and sends
that one sum to the aggregator, which learns only the total. Messages and bytes are counted
from the arrays sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import CryptoRNG

RING_BITS = 64
_LIMIT = 2.0**62  # |encoded value| bound: sums of up to 2 values of this size cannot wrap


def encode(values: np.ndarray, frac_bits: int) -> np.ndarray:
    """Fixed-point ring elements (uint64) for float values."""
    if not 0 <= frac_bits <= 48:
        raise ConfigError(f"frac_bits must be in [0, 48], got {frac_bits}")
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ProtocolError("cannot encode NaN or infinite values")
    scaled = np.rint(v * 2.0**frac_bits)
    if np.any(np.abs(scaled) >= _LIMIT):
        raise ProtocolError(
            f"value {np.abs(v).max():.4g} too large for 2^62 / 2^{frac_bits}; lower frac_bits"
        )
    return scaled.astype(np.int64).view(np.uint64)


def decode(ring: np.ndarray, frac_bits: int) -> np.ndarray:
    """Floats from fixed-point ring elements (values >= 2^63 are negative)."""
    return np.asarray(ring, dtype=np.uint64).view(np.int64).astype(np.float64) / 2.0**frac_bits


def share(x: np.ndarray, parties: int, rng: CryptoRNG) -> np.ndarray:
    """Split ring elements x [...] into `parties` additive shares [parties, ...]."""
    if parties < 2:
        raise ConfigError(f"secret sharing needs at least 2 parties, got {parties}")
    x = np.asarray(x, dtype=np.uint64)
    r = rng.uint64((parties - 1) * x.size).reshape((parties - 1,) + x.shape)
    last = x - r.sum(axis=0, dtype=np.uint64)  # uint64 arithmetic is mod 2^64
    return np.concatenate([r, last[None]], axis=0)


def reconstruct(shares: np.ndarray) -> np.ndarray:
    """Σ shares mod 2^64 over the first axis."""
    return np.asarray(shares, dtype=np.uint64).sum(axis=0, dtype=np.uint64)


@dataclass
class Traffic:
    """Messages and bytes of one secure sum."""

    peer_messages: int = 0  # worker -> worker shares
    peer_bytes: int = 0
    upload_messages: int = 0  # worker -> aggregator partial sums
    upload_bytes: int = 0

    def add(self, other: Traffic) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def secure_sum(values: np.ndarray, frac_bits: int, rng: CryptoRNG) -> tuple[np.ndarray, Traffic]:
    """Sum of the workers' rows `values` [K, ...] through additive sharing; only the sum is opened.

    Returns (decoded sum, traffic). Memory stays O(K · size): shares are generated one worker
    at a time and added into the holders' running sums.
    """
    values = np.asarray(values, dtype=np.float64)
    k = values.shape[0]
    if k < 2:
        raise ConfigError(f"secure sum needs at least 2 workers, got {k}")
    held = np.zeros(values.shape, dtype=np.uint64)  # held[j]: sum of the shares worker j received
    t = Traffic()
    for i in range(k):
        s = share(encode(values[i], frac_bits), k, rng)
        held += s  # worker j receives s[j] (its own share stays local)
        t.peer_messages += k - 1
        t.peer_bytes += (k - 1) * s[0].nbytes
    t.upload_messages += k
    t.upload_bytes += k * held[0].nbytes
    return decode(reconstruct(held), frac_bits), t
