"""The per-sample training loss of a model's outputs: cross-entropy, or BCE on logits for binary tasks."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def loss_per_sample(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    if task == "binary":
        return F.binary_cross_entropy_with_logits(out.reshape(-1), y.reshape(-1).to(out.dtype), reduction="none")
    return F.cross_entropy(out, y.reshape(-1), reduction="none")
