"""FL-RND (thesis Alg. 5) and FL-BASIC (§4.2.2): a fresh seed-shared random coordinate subset
every round. FL-RND trains the full model and sends the subset's values; FL-BASIC trains only
the subset (the others are reset after every SGD step) and sends its values.

FL-RND   = [RandomSubsetStep(r)]                  | PlainTransport(float32) | weighted mean
FL-BASIC = [RandomSubsetStep(r, mask_training=True)] | PlainTransport(float32) | mean
"""

from __future__ import annotations

import torch

from dpfl.compression.subset import count_for_ratio, gather, random_subset, scatter
from dpfl.schemes.base import RoundContext, SetupContext, Step


class RandomSubsetStep(Step):
    """Client: the values of the round's K = ⌊r·n⌋ random coordinates; server: scatter them back."""

    def __init__(self, ratio: float, mask_training: bool = False):
        self.ratio = ratio
        self.mask_training = mask_training
        self.name = "basic" if mask_training else "rnd"
        self.k = 0
        self._round: tuple[int, torch.Tensor] | None = None

    def setup(self, ctx: SetupContext) -> None:
        self.k = count_for_ratio(self.ratio, ctx.n_params)

    def subset(self, ctx: RoundContext) -> torch.Tensor:
        """This round's coordinates (sorted), the same for every participant."""
        if self._round is None or self._round[0] != ctx.round:
            idx = random_subset(ctx.n_params, self.k, ctx.numpy_rng(self.name, "subset"))
            self._round = (ctx.round, idx.to(ctx.device))
        return self._round[1]

    def train_mask(self, ctx: RoundContext) -> torch.Tensor | None:
        if not self.mask_training:
            return None
        mask = torch.zeros(ctx.n_params, dtype=torch.bool, device=ctx.device)
        mask[self.subset(ctx)] = True
        return mask

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return gather(u, self.subset(ctx))

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return scatter(agg.to(torch.float32), self.subset(ctx), ctx.n_params)

    def describe(self) -> str:
        return f"{self.name}(r={self.ratio})"
