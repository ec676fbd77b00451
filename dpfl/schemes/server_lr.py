"""FL-STD (thesis §2.1, data-size-weighted FedAvg) and FedSGD."""

from __future__ import annotations

import torch

from dpfl.schemes.base import RoundContext, Step


class ServerLRStep(Step):
    """Scales the aggregate by a server learning rate (FedSGD's η, or 1 for FedAvg)."""

    name = "server_lr"

    def __init__(self, lr: float = 1.0):
        self.lr = lr

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return agg * self.lr if self.lr != 1.0 else agg
