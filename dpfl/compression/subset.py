"""Coordinate subsets: FL-RND's seed-shared random m-subset and FL-BASIC's random K-subset.

Both are drawn fresh every round from a generator every participant can derive from the shared
seed (`RoundContext.numpy_rng(...)`), so clients and server agree without sending indices.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from dpfl.errors import ConfigError


def count_for_ratio(r: float, n: int) -> int:
    """K = ⌊r·n⌋ with r read as the decimal it is written as (0.005·1,663,370 → 8316)."""
    if not 0 < r <= 1:
        raise ConfigError(f"compression ratio r must be in (0, 1], got {r}")
    k = int(Fraction(str(r)) * n)  # exact floor for positive values
    if k < 1:
        raise ConfigError(f"r = {r} keeps no coordinate of n = {n} (⌊r·n⌋ = 0); use r ≥ {1 / n:.3g}")
    return k


def random_subset(n: int, m: int, rng: np.random.Generator) -> torch.Tensor:
    """m distinct coordinates of range(n), sorted, as int64."""
    if not 1 <= m <= n:
        raise ConfigError(f"subset size must be in [1, n={n}], got {m}")
    idx = np.sort(rng.choice(n, size=m, replace=False))
    return torch.from_numpy(idx.astype(np.int64))


def gather(u: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The chosen coordinates of every row: [..., n] → [..., m]."""
    return torch.index_select(u, -1, idx.to(u.device))


def scatter(values: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of `gather` for one vector: [m] → [n], zero elsewhere."""
    out = values.new_zeros(n)
    out[idx.to(values.device)] = values
    return out
