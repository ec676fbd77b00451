"""Flat parameter vectors: one float32 vector per model, `named_parameters()` order."""

from __future__ import annotations

import math

import torch
from torch import nn


class FlatParams:
    """Maps between a model's named parameters and a flat vector (or a stack of them)."""

    def __init__(self, model: nn.Module):
        self.names: list[str] = []
        self.shapes: list[torch.Size] = []
        self.offsets: list[int] = []
        n = 0
        for name, p in model.named_parameters():
            self.names.append(name)
            self.shapes.append(p.shape)
            self.offsets.append(n)
            n += p.numel()
        self.n = n

    def flatten(self, model: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views into `flat` of shape [n] or [k, n] as a {name: [(k,) *shape]} dict."""
        lead = flat.shape[:-1]
        out = {}
        for name, shape, off in zip(self.names, self.shapes, self.offsets):
            size = math.prod(shape)
            out[name] = flat[..., off : off + size].view(*lead, *shape)
        return out

    def load_into(self, model: nn.Module, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, v in zip(model.parameters(), self.views(flat).values()):
                p.copy_(v)
