"""Keras 2.2 default initialisation, so models start as the thesis's did.

Dense / Conv kernels: glorot_uniform (PyTorch's xavier_uniform_ uses the same fans for
[out, in, *k] weights); biases: zeros; Embedding: uniform(-0.05, 0.05); LSTM: kernel
glorot_uniform, recurrent kernel orthogonal, bias zeros with the forget gate at 1
(unit_forget_bias). PyTorch's own defaults (kaiming-uniform, non-zero biases) differ.
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def keras_init_(module: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """Re-initialise every Linear, Conv, Embedding and KerasLSTM of `module` in place."""
    from dpfl.models.text import KerasLSTM

    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight, generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.uniform_(m.weight, -0.05, 0.05, generator=generator)
        elif isinstance(m, KerasLSTM):
            nn.init.xavier_uniform_(m.weight_ih, generator=generator)
            nn.init.orthogonal_(m.weight_hh, generator=generator)
            nn.init.zeros_(m.bias)
            m.bias[m.hidden_size : 2 * m.hidden_size] = 1.0
    return module


def keras_order(model: nn.Module) -> torch.Tensor:
    """The flat-vector order Keras 2.2 gives `model`'s weights: int64 [n], entry t is the index in
    this library's flat vector (`named_parameters()` order) of the t-th value of
    `concatenate([w.flatten() for w in keras_model.get_weights()])`.

    Keras stores a Conv2d kernel as [kh, kw, in, out] (here [out, in, kh, kw]) and a Dense kernel
    as [in, out] (here [out, in]); a Dense layer fed by a flattened conv map sees the features
    in (H, W, C) order (here (C, H, W)), the map taken as square. Biases are the same. Models
    with other parametric layers are refused."""
    from dpfl.errors import ConfigError

    parts, offset, channels = [], 0, None
    for name, m in model.named_modules():
        own = dict(m.named_parameters(recurse=False))
        if not own:
            continue
        if not isinstance(m, (nn.Conv2d, nn.Linear)) or set(own) - {"weight", "bias"}:
            raise ConfigError(f"layout = 'keras' knows Conv2d and Linear layers only, not {name} "
                              f"({type(m).__name__})")
        for pname, p in own.items():  # named_parameters() order: weight, then bias
            idx = torch.arange(offset, offset + p.numel()).view(p.shape)
            offset += p.numel()
            if pname == "weight" and isinstance(m, nn.Conv2d):
                idx = idx.permute(2, 3, 1, 0)
            elif pname == "weight" and channels is not None:  # the first Dense after the convs
                side = math.isqrt(m.in_features // channels)
                if side * side * channels != m.in_features:
                    raise ConfigError(f"layout = 'keras': {name} takes {m.in_features} features, "
                                      f"not a square map of {channels} channels")
                idx = idx.view(m.out_features, channels, side, side).permute(2, 3, 1, 0)
            elif pname == "weight":
                idx = idx.t()
            parts.append(idx.reshape(-1))
        channels = m.out_channels if isinstance(m, nn.Conv2d) else None
    if offset != sum(p.numel() for p in model.parameters()):
        raise ConfigError("layout = 'keras': the model holds parameters outside its layers' own")
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
