"""DP-SGD step (Abadi et al. 2016, Alg. 1) as pure functions on a params dict.

    g_i = ∇ℓ(θ; x_i)                       per-example gradients, torch.func vmap(grad)
    ḡ_i = g_i · min(1, C / ‖g_i‖₂)          per-example clipping to norm C
    g̃   = (Σ_i m_i ḡ_i + N(0, σ²C² I)) / L   m_i = 0 masks padding rows; L = expected batch size
    θ  ← θ − η g̃

`clipped_grad_sum` has no randomness and no data-dependent control flow, so it can itself be
vmapped over the clients of a round; `dpsgd_step` adds the noise (from `CryptoRNG`) and updates.
`dpsgd_step` and train.py form the same sum by book-keeping (ghost.py) where the model allows it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from dpfl.errors import ConfigError, PrivacyError
from dpfl.rng import CryptoRNG

LOSSES = ("ce", "bce")
# Norms: float32 over blocks of 1024 values, blocks added in float64. Any float32 sum of k terms
# is within (k−1)·2⁻²⁴ relative of the truth (Higham), so the norm is within ~3.1e-5; clipping
# to C·(1 − 2⁻¹²) keeps every clipped gradient's true norm below C despite rounding.
_BLOCK = 1024
_CLIP_MARGIN = 1.0 - 2.0**-12

Params = dict[str, torch.Tensor]


def _loss_fn(model: torch.nn.Module, buffers: Params, loss: str) -> Callable:
    if loss not in LOSSES:
        raise ConfigError(f"loss must be one of {LOSSES}, got {loss!r}")

    def one(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        if loss == "ce":
            return F.cross_entropy(out, y.unsqueeze(0))
        return F.binary_cross_entropy_with_logits(out.reshape(1), y.reshape(1).to(out.dtype))

    return one


def per_example_grads(
    params: Params,
    buffers: Params,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str = "ce",
) -> Params:
    """{name: [B, *shape]} gradients of each example's loss."""
    return vmap(grad(_loss_fn(model, buffers, loss)), in_dims=(None, 0, 0), randomness="different")(
        params, x, y
    )


def _sq_norm(g: torch.Tensor) -> torch.Tensor:
    """Squared l2 norm of each row of g [B, ...], float64 [B]."""
    flat = g.reshape(g.shape[0], -1)
    n = flat.shape[1] // _BLOCK * _BLOCK
    blocks = torch.linalg.vector_norm(flat[:, :n].reshape(flat.shape[0], -1, _BLOCK), dim=-1).double()
    rest = torch.linalg.vector_norm(flat[:, n:], dim=-1).double()
    return blocks.pow(2).sum(dim=-1) + rest.pow(2)


def clip_factors(grads: Params, clip: float) -> torch.Tensor:
    """Per-example factors min(1, C'/‖g_i‖), C' = C(1 − 2⁻¹²), norm over all tensors, float64 [B]."""
    norms = sum(_sq_norm(g) for g in grads.values()).sqrt()
    return torch.clamp(clip * _CLIP_MARGIN / norms, max=1.0)  # norm 0 -> inf -> 1


def clipped_grad_sum(
    params: Params,
    buffers: Params,
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss: str = "ce",
    mask: torch.Tensor | None = None,
) -> Params:
    """Σ_i m_i ḡ_i: the sum of clipped per-example gradients (mask: float/bool [B], 0 = padding)."""
    grads = per_example_grads(params, buffers, model, x, y, loss=loss)
    w = clip_factors(grads, clip)
    if mask is not None:
        w = w * mask.to(device=w.device, dtype=w.dtype)
    return {k: torch.einsum("b,b...->...", w.to(g.dtype), g) for k, g in grads.items()}


def check_dp_args(clip: float, noise_multiplier: float, lr: float) -> None:
    if not clip > 0:
        raise PrivacyError(f"clipping bound C must be > 0, got {clip}")
    if not noise_multiplier >= 0:
        raise PrivacyError(f"noise multiplier σ must be >= 0, got {noise_multiplier}")
    if not lr > 0:
        raise ConfigError(f"learning rate must be > 0, got {lr}")


def gaussian_like(tensors: Params, std: float, rng: CryptoRNG) -> Params:
    """Independent N(0, std²) noise shaped like `tensors`, drawn from `rng` (in dict order)."""
    if not isinstance(rng, CryptoRNG):
        raise PrivacyError(f"DP noise must come from dpfl.rng.CryptoRNG, got {type(rng).__name__}")
    total = sum(t.numel() for t in tensors.values())
    dtypes = {t.dtype for t in tensors.values()}
    flat = torch.empty(total, dtype=dtypes.pop() if len(dtypes) == 1 else torch.float64)
    rng.gaussian_into(flat, float(std))  # = pate.noise.gaussian(rng, total, std), rounded to flat.dtype
    out, i = {}, 0
    for k, t in tensors.items():
        out[k] = flat[i : i + t.numel()].reshape(t.shape).to(device=t.device, dtype=t.dtype)
        i += t.numel()
    return out


def noisy_gradient(
    grad_sum: Params,
    *,
    clip: float,
    noise_multiplier: float,
    expected_batch_size: float,
    generator: CryptoRNG,
) -> Params:
    """(Σ ḡ_i + N(0, σ²C²)) / L, computed as Σ ḡ_i / L + N(0, (σC/L)²)."""
    if not expected_batch_size > 0:
        raise ConfigError(f"expected batch size must be > 0, got {expected_batch_size}")
    if noise_multiplier == 0:
        return {k: g / expected_batch_size for k, g in grad_sum.items()}
    noise = gaussian_like(grad_sum, noise_multiplier * clip / expected_batch_size, generator)
    return {k: noise[k].add_(g, alpha=1.0 / expected_batch_size) for k, g in grad_sum.items()}
