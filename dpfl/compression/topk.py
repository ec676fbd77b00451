"""FL-TOP's coordinate set (thesis Alg. 7): the K parameters whose accumulated |gradient| over
T_init SGD steps from w_0 on a small public batch is largest."""

from __future__ import annotations

from collections.abc import Callable

import torch

from dpfl.errors import ConfigError


def accumulated_abs_grad(grad_fn: Callable[[torch.Tensor], torch.Tensor], w0: torch.Tensor,
                         steps: int, lr: float) -> torch.Tensor:
    """Σ_t |∇f(w_t)| over `steps` SGD steps w_{t+1} = w_t − lr·∇f(w_t), from w_0 (float64 sum)."""
    if steps < 1:
        raise ConfigError(f"T_init must be ≥ 1 SGD step, got {steps}")
    if not lr > 0:
        raise ConfigError(f"T_init learning rate must be > 0, got {lr}")
    w = w0.detach().clone()
    acc = torch.zeros_like(w, dtype=torch.float64)
    for _ in range(steps):
        g = grad_fn(w).detach()
        acc += g.abs().to(torch.float64)
        w = w - lr * g
    return acc


def topk_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, sorted ascending; ties go to the lower index."""
    n = scores.numel()
    if not 1 <= k <= n:
        raise ConfigError(f"K must be in [1, n={n}], got {k}")
    order = torch.sort(scores.reshape(-1), descending=True, stable=True).indices[:k]
    return torch.sort(order).values
