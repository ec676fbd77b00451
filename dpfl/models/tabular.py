"""Dense models: the thesis's medical MLP, and small MLP / logistic regression for tests and digits.

Inputs of any shape [B, ...] are flattened. `num_classes=1` means a binary task: the model
returns one logit per sample, shape [B] (for BCE-with-logits); otherwise logits [B, C].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU -> Dropout(dropout)] per hidden width -> Linear(num_classes)."""

    def __init__(
        self, in_features: int, hidden: int | Sequence[int] = (), num_classes: int = 10, dropout: float = 0.0
    ):
        super().__init__()
        widths = [hidden] if isinstance(hidden, int) else list(hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for w in widths:
            layers += [nn.Linear(prev, w), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout > 0 else [])
            prev = w
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)
        self.binary = num_classes == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out.squeeze(-1) if self.binary else out


def medical_mlp(in_features: int = 7280) -> MLP:
    """[Ava+18] mortality MLP: 7,280 -> 200 ReLU -> Dropout 0.5 -> 200 ReLU -> Dropout 0.5 -> 1 logit.
    1,496,601 parameters."""
    return MLP(in_features, (200, 200), num_classes=1, dropout=0.5)


def logreg(in_features: int, num_classes: int = 10) -> MLP:
    """Multinomial (num_classes > 1) or binary (num_classes = 1) logistic regression."""
    return MLP(in_features, (), num_classes)
