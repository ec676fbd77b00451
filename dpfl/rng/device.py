"""Gaussian rows drawn where the tensor is: each row from its own CryptoRNG's ChaCha20 stream,
all rows at once (one Triton kernel on CUDA; `chacha.blocks_eager` elsewhere), the same values as
`CryptoRNG.gaussian_into` on the CPU."""

from __future__ import annotations

import torch

from dpfl.rng import gauss
from dpfl.rng.chacha import words64_at, words64_rows

_ROWS_EAGER = 8  # rows per pass of the eager path (bounds its int64 word buffer)


def _fast_rows(keys: torch.Tensor, start: torch.Tensor, out: torch.Tensor, std: float) -> torch.Tensor:
    """Fast path into out; returns the rejected positions as a bool mask."""
    if out.device.type == "cuda":
        from dpfl.rng import cuda

        if cuda.available():
            cuda.gauss_fast(keys, start, out, std)
            return torch.isnan(out)
    bad = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    for r in range(0, out.shape[0], _ROWS_EAGER):
        w = words64_rows(keys[r : r + _ROWS_EAGER], start[r : r + _ROWS_EAGER], out.shape[1])
        x, b = gauss.fast(w, std)
        out[r : r + _ROWS_EAGER].copy_(x)
        bad[r : r + _ROWS_EAGER] = b
    return bad


def gaussian_rows(rngs: list, out: torch.Tensor, std: float) -> torch.Tensor:
    """Row r of out ([k, n] contiguous float on any device) ← rngs[r].gaussian_into(out[r], std)."""
    k, n = out.shape
    dev = out.device
    odd = [r for r, g in enumerate(rngs) if g.position % 8]
    for r in odd:  # a stream not at a word boundary: drawn on the CPU (the same values)
        out[r].copy_(rngs[r].gaussian_into(torch.empty(n, dtype=out.dtype), std))
    todo = [r for r in range(k) if r not in set(odd)]
    if not todo or n == 0:
        return out
    sub = out if len(todo) == k else torch.empty(len(todo), n, dtype=out.dtype, device=dev)
    keys = torch.tensor([rngs[r].key_words() for r in todo], dtype=torch.int64, device=dev)
    start = torch.tensor([rngs[r].position // 8 for r in todo], dtype=torch.int64, device=dev)
    for r in todo:
        rngs[r]._check(8 * n)
    bad = _fast_rows(keys, start, sub, std)
    rows, idx = bad.nonzero(as_tuple=True)  # row-major: each row's rejects in index order
    used = torch.zeros(len(todo), dtype=torch.int64, device=dev)
    if rows.numel():
        cand = words64_at(keys, rows, start[rows] + idx)

        def extra(open_: torch.Tensor) -> torch.Tensor:
            r = rows[open_]
            counts = torch.bincount(r, minlength=len(todo))
            rank = torch.arange(r.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[r]
            pos = (start[r] + n + used[r] + 3 * rank).unsqueeze(1) + torch.arange(3, device=dev)
            used.add_(3 * counts)
            return words64_at(keys, r.repeat_interleave(3), pos.reshape(-1)).view(-1, 3)

        sub[rows, idx] = gauss.resolve(cand, extra, float(std)).to(out.dtype)
    if sub is not out:
        out[todo] = sub
    for r, u in zip(todo, used.tolist()):
        rngs[r].advance(8 * (n + u))
    return out
