"""One DP-SGD step: the clipped gradient sum (by book-keeping where the model allows it, else
per-example gradients) plus Gaussian noise, then an SGD update."""

from __future__ import annotations

import torch

from dpfl.dpsgd.core import Params, check_dp_args, noisy_gradient
from dpfl.dpsgd.ghost import clipped_sum
from dpfl.errors import ConfigError
from dpfl.rng import CryptoRNG


def dpsgd_step(
    params: Params,
    buffers: Params,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    noise_multiplier: float,
    lr: float,
    generator: CryptoRNG,
    loss: str = "ce",
    mask: torch.Tensor | None = None,
    expected_batch_size: float | None = None,
) -> Params:
    """One DP-SGD step; returns the new params. L defaults to the number of unmasked rows only
    when no mask is given (fixed batches); with Poisson sampling pass L = qN."""
    check_dp_args(clip, noise_multiplier, lr)
    if expected_batch_size is None:
        if mask is not None:
            raise ConfigError("with a mask (Poisson sampling) pass expected_batch_size = q·N")
        expected_batch_size = float(x.shape[0])
    s = clipped_sum(params, buffers, model, x, y, clip=clip, loss=loss, mask=mask)
    g = noisy_gradient(
        s,
        clip=clip,
        noise_multiplier=noise_multiplier,
        expected_batch_size=expected_batch_size,
        generator=generator,
    )
    return {k: torch.add(p, g[k], alpha=-lr) for k, p in params.items()}
