"""Clipped-gradient sum by book-keeping (Bu et al. 2023): one forward, one backward, no full
per-example gradients.

For every layer we keep its input a_i and the gradient g_i of Σ_j ℓ_j with respect to its
output (rows are independent, so that is ∇ℓ_i for row i). Then

    Linear [B, in]:  ‖∇W ℓ_i‖² = ‖a_i‖²‖g_i‖²,  ‖∇b ℓ_i‖² = ‖g_i‖²           (never formed)
    Linear [B, ..., in], Conv2d: ∇W ℓ_i formed one layer at a time (conv: grouped conv backward)
    Σ_i w_i ∇W ℓ_i = (w ⊙ g)ᵀ a,   w_i = min(1, C'/‖∇ℓ_i‖)  (norm over all layers, as core.py)

Only Linear and Conv2d (groups 1, zero padding) may hold parameters; BatchNorm and buffers are
refused. Anything else, a module called twice, or an in-place change of a recorded tensor sends
the call to the per-example vmap path of core.py; `path_for` says which path a model takes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpfl.dpsgd.core import _CLIP_MARGIN, LOSSES, Params, _sq_norm, clipped_grad_sum
from dpfl.errors import ConfigError

_SUPPORTED = (nn.Linear, nn.Conv2d)


def _unsupported(model: nn.Module, buffers: Params | None = None) -> str | None:
    """Why book-keeping cannot run on `model`, or None."""
    if buffers or any(True for _ in model.buffers()):
        return "model has buffers"
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"{name or 'model'} is {type(m).__name__} (mixes rows of the batch)"
        if not any(True for _ in m.parameters(recurse=False)):
            continue
        if type(m) not in _SUPPORTED:
            return f"{name or 'model'} is {type(m).__name__} with parameters"
        if isinstance(m, nn.Conv2d) and (
            m.groups != 1 or m.padding_mode != "zeros" or m.padding == "same"
        ):
            return f"{name} is a grouped, non-zero-padded or 'same'-padded Conv2d"
    return None


def path_for(model: nn.Module) -> str:
    """'book-keeping' or 'per-example (reason)': the path `clipped_sum` takes for `model`."""
    why = _unsupported(model)
    return "book-keeping" if why is None else f"per-example ({why})"


def _per_loss_sum(out: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "ce":
        return F.cross_entropy(out, y, reduction="sum")
    return F.binary_cross_entropy_with_logits(out.reshape(-1), y.reshape(-1).to(out.dtype), reduction="sum")


def _layer_grads(m: nn.Module, a: torch.Tensor, g: torch.Tensor, shape: torch.Size):
    """(sq_norms float64 [B], weight fn w -> Σ w_i ∇W ℓ_i, bias fn or None) for one layer."""
    B = a.shape[0]
    if isinstance(m, nn.Linear) and a.ndim == 2:
        sq = _sq_norm(a) * _sq_norm(g)

        def weight(w):
            return (g * w[:, None]).T @ a

    else:
        if isinstance(m, nn.Conv2d):  # a grouped conv's weight gradient, one group per example
            per = torch.nn.grad.conv2d_weight(
                a.reshape(1, -1, *a.shape[2:]),
                (B * shape[0], *shape[1:]),
                g.reshape(1, -1, *g.shape[2:]),
                stride=m.stride,
                padding=0 if m.padding == "valid" else m.padding,
                dilation=m.dilation,
                groups=B,
            ).reshape(B, shape[0], -1)
            g = g.reshape(B, g.shape[1], -1)  # [B, out, L]
        else:  # Linear on [B, ..., in]: the positions ... are summed over
            a, g = a.reshape(B, -1, a.shape[-1]), g.reshape(B, -1, g.shape[-1])
            per = torch.bmm(g.transpose(1, 2), a)
            g = g.transpose(1, 2)
        sq = _sq_norm(per)  # per [B, out, D]: this layer's per-example gradients

        def weight(w):
            return torch.einsum("b,bod->od", w, per).reshape(shape)

        g = g.sum(-1)  # bias gradient per example [B, out]
    if m.bias is None:
        return sq, weight, None
    return sq + _sq_norm(g), weight, lambda w: w @ g


def bookkeeping_clipped_grad_sum(
    params: Params,
    buffers: Params,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss: str = "ce",
    mask: torch.Tensor | None = None,
) -> Params | None:
    """Σ_i m_i ḡ_i as core.clipped_grad_sum, by book-keeping; None if this call cannot use it."""
    names = {m: n for n, m in model.named_modules() if type(m) in _SUPPORTED}
    seen: list = []  # (module, input, output, versions)

    def hook(m, inp, out):
        seen.append((m, inp[0], out, (inp[0]._version, out._version)))

    handles = [m.register_forward_hook(hook) for m in names]
    try:
        with torch.enable_grad():
            p = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            total = _per_loss_sum(functional_call(model, (p, buffers), (x,)), y, loss)
    finally:
        for h in handles:
            h.remove()
    mods = [s[0] for s in seen]
    if len(set(mods)) != len(mods) or any(
        (a._version, o._version) != v for _, a, o, v in seen
    ):
        return None  # a module ran twice or a recorded tensor was changed in place
    outs = torch.autograd.grad(total, [s[2] for s in seen], allow_unused=True)
    layers, sq = [], 0.0
    for (m, a, o, _), g in zip(seen, outs, strict=True):
        prefix = names[m] + "." if names[m] else ""
        g = torch.zeros_like(o) if g is None else g
        s, wfn, bfn = _layer_grads(m, a.detach(), g.detach(), params[prefix + "weight"].shape)
        layers.append((prefix, wfn, bfn))
        sq = sq + s
    w = torch.clamp(clip * _CLIP_MARGIN / torch.as_tensor(sq).sqrt(), max=1.0)  # norm 0 -> inf -> 1
    if mask is not None:
        w = w * mask.to(device=w.device, dtype=w.dtype)
    out = {}
    for prefix, wfn, bfn in layers:
        wt = w.to(params[prefix + "weight"].dtype)
        out[prefix + "weight"] = wfn(wt)
        if bfn is not None:
            out[prefix + "bias"] = bfn(wt)
    missing = set(params) - set(out)
    for k in missing:  # parameters of layers the forward never used
        out[k] = torch.zeros_like(params[k])
    return {k: out[k] for k in params}


def clipped_sum(
    params: Params,
    buffers: Params,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss: str = "ce",
    mask: torch.Tensor | None = None,
) -> Params:
    """Σ_i m_i ḡ_i: book-keeping where `path_for(model)` allows it, else per-example vmap."""
    if loss not in LOSSES:
        raise ConfigError(f"loss must be one of {LOSSES}, got {loss!r}")
    if _unsupported(model, buffers) is None:
        s = bookkeeping_clipped_grad_sum(params, buffers, model, x, y, clip=clip, loss=loss, mask=mask)
        if s is not None:
            return s
    return clipped_grad_sum(params, buffers, model, x, y, clip=clip, loss=loss, mask=mask)
