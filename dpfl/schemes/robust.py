"""Robust server aggregation rules (defences against malicious clients).

All of them need the individual decoded updates (`Received.rows`), so none can run behind
secure aggregation: `Scheme.setup` refuses the combination, and the rules themselves raise if
they are handed only a sum.

- ``median``: coordinate-wise median (mean of the two middle values when k is even);
- ``trimmed-mean``: per coordinate, drop the ⌊trim·k⌋ largest and smallest values, average the rest;
- ``krum`` / ``multi-krum`` (Blanchard et al. 2017): score_i = Σ of the squared distances to its
  k − f − 2 nearest rows; Krum returns the best-scored row, Multi-Krum the mean of the m best;
- ``norm-bound`` (Sun et al. 2019): rows scaled to L2 ≤ bound, then the data-size-weighted mean;
- ``sign-vote``: FL-SIGN's rule with its check (thesis ch. 6): a row with any value outside
  {−1, +1} is rejected, the others are summed (the majority vote). FL-SIGN's own 1-bit sign
  transport cannot carry other values at all; this rule is for transports that can.

`dpfl.schemes.aggregators.AGGREGATORS` lists them by name.
"""

from __future__ import annotations

import math

import torch

from dpfl.errors import ConfigError
from dpfl.schemes.base import Aggregator, Received, RoundContext

_CHUNK = 1 << 18  # coordinates per block (bounds the memory of sorting [k, n])


def _sorted_blocks(rows: torch.Tensor):
    """(start, rows[:, block] sorted along the client axis, float64) for each coordinate block."""
    for s in range(0, rows.shape[1], _CHUNK):
        yield s, rows[:, s : s + _CHUNK].to(torch.float64).sort(0).values


def coordinate_median(rows: torch.Tensor) -> torch.Tensor:
    k = rows.shape[0]
    out = torch.empty(rows.shape[1], dtype=torch.float64, device=rows.device)
    for s, c in _sorted_blocks(rows):
        out[s : s + c.shape[1]] = c[k // 2] if k % 2 else (c[k // 2 - 1] + c[k // 2]) / 2
    return out.to(torch.float32)


def trimmed_mean(rows: torch.Tensor, b: int) -> torch.Tensor:
    k = rows.shape[0]
    out = torch.empty(rows.shape[1], dtype=torch.float64, device=rows.device)
    for s, c in _sorted_blocks(rows):
        out[s : s + c.shape[1]] = c[b : k - b].mean(0)
    return out.to(torch.float32)


def pairwise_sq_distances(rows: torch.Tensor) -> torch.Tensor:
    """‖r_i − r_j‖² for all pairs, float64 [k, k], from a Gram matrix accumulated block by block."""
    k = rows.shape[0]
    gram = torch.zeros(k, k, dtype=torch.float64, device=rows.device)
    for s in range(0, rows.shape[1], _CHUNK):
        c = rows[:, s : s + _CHUNK].to(torch.float64)
        gram += c @ c.T
    sq = gram.diagonal()
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp_(min=0)


def krum_scores(rows: torch.Tensor, f: int) -> torch.Tensor:
    k = rows.shape[0]
    d = pairwise_sq_distances(rows)
    d.fill_diagonal_(math.inf)
    return d.sort(1).values[:, : k - f - 2].sum(1)


class _RowsAggregator(Aggregator):
    needs_rows = True

    def rows(self, rec: Received) -> torch.Tensor:
        if rec.rows is None:
            raise ConfigError(f"aggregator {self.name!r} needs the individual updates, but the transport "
                              "delivered only their sum (secure aggregation hides individual updates from "
                              "the server); use a mean or sum aggregator with secure aggregation")
        if rec.rows.shape[0] == 0:
            raise ConfigError(f"aggregator {self.name!r} received no updates")
        return rec.rows


class CoordinateMedian(_RowsAggregator):
    name = "median"

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        return coordinate_median(self.rows(rec))


class TrimmedMean(_RowsAggregator):
    name = "trimmed-mean"

    def __init__(self, trim: float = 0.1):
        if isinstance(trim, bool) or not isinstance(trim, (int, float)) or not 0 <= trim < 0.5:
            raise ConfigError(f"aggregator 'trimmed-mean': trim must be a fraction in [0, 0.5), got {trim!r}")
        self.trim = float(trim)

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        rows = self.rows(rec)
        return trimmed_mean(rows, math.floor(self.trim * rows.shape[0]))


class MultiKrum(_RowsAggregator):
    """Mean of the m rows with the lowest Krum scores (m = k − f when not given)."""

    name = "multi-krum"

    def __init__(self, f: int = 1, m: int | None = None):
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ConfigError(f"aggregator {self.name!r}: f (assumed malicious clients) must be an integer ≥ 0, "
                              f"got {f!r}")
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ConfigError(f"aggregator {self.name!r}: m (rows averaged) must be an integer ≥ 1, got {m!r}")
        self.f, self.m = f, m

    def select(self, rows: torch.Tensor) -> torch.Tensor:
        """Indices of the selected rows, best score first."""
        k = rows.shape[0]
        if k < 2 * self.f + 3:
            raise ConfigError(f"aggregator {self.name!r} with f = {self.f} needs at least 2f + 3 = {2 * self.f + 3} "
                              f"updates per round, got {k}; lower f or raise the cohort size")
        m = k - self.f if self.m is None else self.m
        if m > k:
            raise ConfigError(f"aggregator {self.name!r}: m = {m} exceeds the {k} updates of this round")
        return torch.argsort(krum_scores(rows, self.f), stable=True)[:m]

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        rows = self.rows(rec)
        idx = self.select(rows)
        if ctx.malicious is not None:
            ctx.metrics["robust_malicious_selected"] = float(ctx.malicious[idx.cpu().numpy()].sum())
        return rows[idx].to(torch.float64).mean(0).to(torch.float32)


class Krum(MultiKrum):
    """The single row with the lowest Krum score."""

    name = "krum"

    def __init__(self, f: int = 1):
        super().__init__(f, 1)


class NormBound(_RowsAggregator):
    name = "norm-bound"

    def __init__(self, bound: float):
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 < bound < math.inf:
            raise ConfigError(f"aggregator 'norm-bound': bound (max L2 norm of an update) must be > 0, "
                              f"got {bound!r}")
        self.bound = float(bound)

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        rows = self.rows(rec).to(torch.float64)
        norms = rows.norm(dim=1)
        scale = (self.bound / norms).clamp(max=1.0).nan_to_num(1.0)
        ctx.metrics["robust_clipped"] = float((norms > self.bound).sum())
        w = ctx.weights.to(torch.float64)
        return ((w * scale / w.sum()) @ rows).to(torch.float32)


class SignVote(_RowsAggregator):
    name = "sign-vote"

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        rows = self.rows(rec)
        ok = ((rows == 1) | (rows == -1)).all(1)
        ctx.metrics["robust_rejected"] = float((~ok).sum())
        return rows[ok].to(torch.int64).sum(0).to(torch.float32)


RULES = {c.name: c for c in (CoordinateMedian, TrimmedMean, Krum, MultiKrum, NormBound, SignVote)}
