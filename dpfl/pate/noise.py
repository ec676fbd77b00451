"""Laplace and Gaussian noise drawn from `CryptoRNG` (ChaCha20 keystream; 53-bit uniforms, the ziggurat).

Used by PATE's noisy max, DP-SGD and the dataset generator. Only argmaxes (PATE) or sums of
noise with real-valued gradients (DP-SGD) are released, never a lone noisy value.
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.errors import PrivacyError
from dpfl.rng import CryptoRNG


def _open_uniform(rng: CryptoRNG, n: int) -> np.ndarray:
    """Uniforms in the open interval (0, 1): (k + 1/2) / 2^53."""
    k = rng.uint64(n)
    k >>= np.uint64(11)
    u = k.astype(np.float64)
    u += 0.5
    u *= 1.0 / (1 << 53)
    return u


def laplace(rng: CryptoRNG, size: int | tuple[int, ...], scale: float | np.ndarray) -> np.ndarray:
    """Lap(0, scale) samples (inverse CDF), float64."""
    scale = np.asarray(scale, dtype=np.float64)
    if np.any(scale <= 0) or not np.all(np.isfinite(scale)):
        raise PrivacyError(f"Laplace scale must be > 0 and finite, got {scale}")
    shape = (size,) if isinstance(size, int) else tuple(size)
    u = _open_uniform(rng, int(np.prod(shape))).reshape(shape) - 0.5
    return -scale * np.sign(u) * np.log1p(-2.0 * np.abs(u))


def gaussian(rng: CryptoRNG, size: int | tuple[int, ...], std: float | np.ndarray) -> np.ndarray:
    """N(0, std²) samples, float64: `CryptoRNG.gaussian_into` (dpfl's one Gaussian sampler)."""
    std = np.asarray(std, dtype=np.float64)
    if np.any(std < 0) or not np.all(np.isfinite(std)):
        raise PrivacyError(f"Gaussian std must be >= 0 and finite, got {std}")
    shape = (size,) if isinstance(size, int) else tuple(size)
    z = torch.empty(int(np.prod(shape)), dtype=torch.float64)  # dpfl's one Gaussian sampler
    z = rng.gaussian_into(z, float(std) if std.ndim == 0 else 1.0).numpy().reshape(shape)
    return z if std.ndim == 0 else std * z
