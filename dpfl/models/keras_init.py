"""Keras 2.2 default initialisation, so models start as the thesis's did.

Dense / Conv kernels: glorot_uniform (PyTorch's xavier_uniform_ uses the same fans for
[out, in, *k] weights); biases: zeros; Embedding: uniform(-0.05, 0.05); LSTM: kernel
glorot_uniform, recurrent kernel orthogonal, bias zeros with the forget gate at 1
(unit_forget_bias). PyTorch's own defaults (kaiming-uniform, non-zero biases) differ.
"""

from __future__ import annotations

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
