"""Correlated noise streams: round t's z̃_t = (F Z)_t of a factorization (`dpfl.privacy.factorization`),
one round at a time, with Z's rows drawn by `draw(key)` (unit Gaussian vectors: in dpfl from the
run's CryptoRNG keys, `dpfl.rng`; a test may pass any linear probe).

* `TreeNoise` (stateless): z̃_t = N(p) − N(p − 1), N(p) the sum of the node draws of the segment's
  p-th prefix (`segment_prefix`); the nodes both hold cancel and are not drawn: about two draws a round.
* `BandNoise` (b − 1 rows of state): forward substitution in C z̃ = Z,
  z̃_t = (Z_t − Σ_{j=1}^{b−1} C[t, t−j] z̃_{t−j}) / C[t, t]. A round that released nothing still advances
  the state (`noise(t)` computes every round up to t), so z̃_t always belongs to round t.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dpfl.errors import PrivacyError
from dpfl.privacy.factorization import Factorization, segment_prefix

Draw = Callable[[tuple[int, ...]], torch.Tensor]


class TreeNoise:
    """DP-FTRL's per-round noise from the node draws (see the module docstring)."""

    def __init__(self, mf: Factorization):
        if mf.name != "tree":
            raise PrivacyError(f"TreeNoise needs a tree factorization, got {mf.name!r}")
        self.where: list[tuple[int, int, int]] = []  # round t - 1 -> (segment, p, segment length)
        for s, length in enumerate(mf.segments):
            self.where += [(s, p, length) for p in range(1, length + 1)]
        self.completion = mf.completion

    def terms(self, t: int) -> list[tuple[float, tuple[int, int, int]]]:
        """(sign, node key) whose draws sum to z̃_t."""
        s, p, length = self.where[t - 1]
        now = set(segment_prefix(p, length, self.completion))
        before = set(segment_prefix(p - 1, length, self.completion)) if p > 1 else set()
        return ([(1.0, (s, *n)) for n in sorted(now - before)]
                + [(-1.0, (s, *n)) for n in sorted(before - now)])

    def noise(self, t: int, draw: Draw) -> torch.Tensor:
        out = None
        for sign, key in self.terms(t):  # a + term first: the newest node
            z = draw(key).to(torch.float64)
            if out is None:
                out = z.clone()
            else:
                out.add_(z, alpha=sign)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class BandNoise:
    """BandMF's per-round noise, C⁻¹Z by forward substitution with b − 1 rows of state."""

    def __init__(self, mf: Factorization):
        if mf.name != "bandmf":
            raise PrivacyError(f"BandNoise needs a bandmf factorization, got {mf.name!r}")
        self.c = mf.encoder
        self.bands = mf.bands
        self.last = 0  # the last round computed
        self.rows: list[torch.Tensor] = []  # z̃ of rounds last − len(rows) + 1 .. last (float64)

    def band(self) -> np.ndarray:
        """C's band: [t, j] = C[t, t − j] (0 where t − j < 0), float64 [T, b]."""
        t = self.c.shape[0]
        out = np.zeros((t, self.bands))
        for j in range(self.bands):
            out[j:, j] = np.diagonal(self.c, -j)
        return out

    def noise(self, t: int, draw: Draw) -> torch.Tensor:
        if t <= self.last:
            raise PrivacyError(f"BandMF noise of round {t} was drawn already (the stream is at round {self.last})")
        while self.last < t:
            r = self.last + 1
            z = draw((r,)).to(torch.float64)
            for j, prev in enumerate(reversed(self.rows), 1):
                z.sub_(prev, alpha=float(self.c[r - 1, r - 1 - j]))
            z.div_(float(self.c[r - 1, r - 1]))
            self.rows = [*self.rows, z][-(self.bands - 1):] if self.bands > 1 else []
            self.last = r
        return z.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last, "rows": [r.clone() for r in self.rows], "band": torch.from_numpy(self.band())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        band = state["band"].numpy() if isinstance(state["band"], torch.Tensor) else np.asarray(state["band"])
        mine = self.band()
        if band.shape != mine.shape or not np.allclose(band, mine, rtol=1e-9, atol=1e-12):
            raise ValueError("the checkpoint's BandMF matrix is not this run's (rounds or bands changed)")
        t = self.c.shape[0]
        c = np.zeros_like(self.c)  # the checkpoint's own C, so the stream goes on with the noise it began
        for j in range(self.bands):
            c[np.arange(j, t), np.arange(0, t - j)] = band[j:, j]
        self.c = c
        self.last = int(state["last"])
        self.rows = [torch.as_tensor(r, dtype=torch.float64).clone() for r in state["rows"]]


def stream(mf: Factorization) -> TreeNoise | BandNoise:
    return TreeNoise(mf) if mf.name == "tree" else BandNoise(mf)
