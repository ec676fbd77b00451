"""Canary directions: m fixed random unit vectors in the model's parameter space, drawn from the run's
seed, each included in training independently with probability 1/2."""

from __future__ import annotations

import numpy as np
import torch

from dpfl.rng import Seeds

_CACHE_BYTES = 1 << 30  # directions kept in memory up to 1 GiB, regenerated chunk by chunk beyond
_CHUNK = 64  # directions drawn per generator


class CanarySet:
    """m unit directions u_j ∈ R^n (Gaussian, normalized) and the inclusion coins b_j ~ Bernoulli(1/2)."""

    def __init__(self, m: int, n: int, seeds: Seeds):
        if m < 2:
            raise ValueError(f"an audit needs at least 2 canaries, got {m}")
        self.m, self.n, self.seeds = int(m), int(n), seeds
        self.included = seeds.numpy("audit", "include").random(self.m) < 0.5
        self._rows: torch.Tensor | None = None
        if self.m * self.n * 4 <= _CACHE_BYTES:
            self._rows = torch.cat([self._chunk(c) for c in range(0, self.m, _CHUNK)])

    def _chunk(self, start: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seeds.seed("audit", "directions", start))
        z = torch.randn(min(_CHUNK, self.m - start), self.n, generator=g, dtype=torch.float64)
        return (z / z.norm(dim=1, keepdim=True)).to(torch.float32)

    def rows(self, idx: np.ndarray) -> torch.Tensor:
        """Directions idx, float32 [len(idx), n]."""
        idx = np.asarray(idx, dtype=np.int64)
        if self._rows is not None:
            return self._rows[torch.from_numpy(idx)]
        out = torch.empty(len(idx), self.n)
        for start in np.unique(idx // _CHUNK * _CHUNK):
            chunk, sel = self._chunk(int(start)), np.flatnonzero(idx // _CHUNK * _CHUNK == start)
            out[torch.from_numpy(sel)] = chunk[torch.from_numpy(idx[sel] - start)]
        return out

    def dots(self, v: torch.Tensor) -> np.ndarray:
        """⟨u_j, v⟩ for every canary, float64 [m] (in blocks: no float64 copy of all the directions)."""
        v = v.detach().to("cpu", torch.float64)
        out = []
        for s in range(0, self.m, _CHUNK):
            block = self._rows[s:s + _CHUNK] if self._rows is not None else self._chunk(s)
            out.append((block.to(torch.float64) @ v).numpy())
        return np.concatenate(out)
