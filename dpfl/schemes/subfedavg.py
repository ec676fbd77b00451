"""Sub-FedAvg, unstructured (Vahidian et al. 2021; survey notes §1.9): personalised sub-networks
by magnitude pruning, averaged on the intersection.

SUB-FEDAVG = [SubFedAvgStep(s, p)] | PlainTransport(float32) | sum → per-coordinate mean over keepers

Every client k keeps a binary mask M_k (all ones until it first takes part). In a round:

1. client k starts from its sub-network w ⊙ M_k and trains only the kept coordinates (the
   engine's per-client start points and masks, `ClientPlan(start, mask)`): pruned weights stay 0;
2. while its sparsity is below the target `sparsity`, it prunes `prune_rate` of its remaining
   weights with the smallest magnitude |θ_k| after training, layer by layer (weights of Linear /
   Conv layers; biases are never pruned), never past the target; masks only shrink;
3. it sends (θ_k − w) ⊙ M_k (its new mask); the server sums them and divides each coordinate by
   the number of this round's clients whose masks keep it ("averaged on the intersection");
   coordinates nobody kept do not move.

Personalised evaluation (option `personal_eval` = number of test samples, 0 = off): after the
update, each of the round's clients evaluates its personal model w_{t+1} ⊙ M_k on the test
samples whose label occurs in its own training data (a stand-in for its local test set under
label skew); the round's mean is the metric `step_personal_accuracy`, beside
`step_personal_global_accuracy` (the unpruned global model on the same samples) and
`step_sparsity` (the cohort's mean pruned fraction of prunable weights).

Masks live in a `ClientTable` of bools: n bytes per client seen.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpfl.data.dataset import as_model_input
from dpfl.errors import ProtocolError
from dpfl.schemes.base import ClientPlan, RoundContext, SetupContext, Step
from dpfl.schemes.client_state import ClientTable


class SubFedAvgStep(Step):
    """Per-client masks: masked start and training, magnitude pruning, intersection averaging."""

    name = "sub-fedavg"
    changes_local_training = True
    client_state = True  # a deployed client keeps its row on its node

    def __init__(self, sparsity: float, prune_rate: float, personal_eval: int = 500):
        self.sparsity, self.prune_rate, self.personal_eval = float(sparsity), float(prune_rate), int(personal_eval)
        self.table: ClientTable | None = None
        self._pending: dict[str, Any] | None = None
        self._round: dict[str, Any] = {}

    def setup(self, ctx: SetupContext) -> None:
        flat = ctx.trainer.flat
        self.n = ctx.n_params
        # prunable layers: the parameters with ≥ 2 dimensions (Linear / Conv weights), as (offset, size)
        self.layers = [(off, math.prod(shape)) for shape, off in zip(flat.shapes, flat.offsets) if len(shape) >= 2]
        self.n_prunable = sum(size for _, size in self.layers)
        self.table = ClientTable(self.n, torch.bool, ctx.device, fill=True, max_rows=ctx.n_clients)
        self.cohort_model = ctx.trainer.cohort
        self.fed = ctx.clients
        if self.personal_eval and self.fed is not None:
            nt = len(self.fed.y_test)
            pick = np.sort(ctx.seeds.numpy("sub-fedavg", "personal-eval").permutation(nt)[: self.personal_eval])
            self._eval_idx = torch.from_numpy(pick).to(ctx.device)
        if self._pending is not None:
            self.load_state_dict(self._pending)
            self._pending = None

    # ---- client side ------------------------------------------------------------
    def masks(self, ctx: RoundContext) -> torch.Tensor:
        """The answering clients' masks M_k, bool [k, n]."""
        if self._round.get("round") != ctx.round:
            self._round = {"round": ctx.round, "masks": self.table.get(ctx.cohort)}
        return self._round["masks"]

    def local_training(self, ctx: RoundContext) -> ClientPlan:
        m = self.masks(ctx)
        return ClientPlan(start=ctx.global_params * m, mask=m)

    def prune(self, theta: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """New masks: each client below the target drops `prune_rate` of its remaining prunable
        weights (smallest |θ| per layer), never past `sparsity`."""
        new = masks.clone()
        if not self.n_prunable or self.sparsity <= 0:
            return new
        kept = sum(masks[:, off : off + size].sum(1) for off, size in self.layers).to(torch.float64)
        density = kept / self.n_prunable
        target = torch.clamp(density * (1 - self.prune_rate), min=1 - self.sparsity)  # next density
        for off, size in self.layers:
            m = masks[:, off : off + size]
            score = torch.where(m, theta[:, off : off + size].abs(), torch.full_like(theta[:, :1], -1.0))
            keep = torch.minimum(m.sum(1), torch.ceil(target * size - 1e-9).to(torch.long).clamp_min(1))
            order = score.argsort(dim=1, descending=True, stable=True)
            ranks = torch.arange(size, device=theta.device).expand_as(order)
            new[:, off : off + size] = torch.zeros_like(m).scatter_(1, order, ranks < keep[:, None])
        return new

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        m = self.masks(ctx)
        theta = ctx.global_params * m + u  # the trained personal sub-networks
        new = self.prune(theta, m)
        self.table.put(ctx.cohort, new)
        self._keep(new, ctx)
        return u * new

    def _keep(self, new: torch.Tensor, ctx: RoundContext) -> None:
        """This round's new masks [k, n], for the server step (and the cohort's sparsity)."""
        self._round.update(round=ctx.round, masks=new, count=new.sum(0, dtype=torch.float32))
        if self.n_prunable:
            kept = sum(new[:, off : off + size].sum(1) for off, size in self.layers).to(torch.float64)
            ctx.metrics["sparsity"] = float(1 - (kept / self.n_prunable).mean())

    def client_report(self, ctx: RoundContext) -> dict[str, torch.Tensor]:
        return {"mask": self._round["masks"]}  # a deployed client's new mask: the server averages on it

    def server_report(self, report: dict[str, torch.Tensor], ctx: RoundContext) -> None:
        mask = report.get("mask")
        if mask is None or mask.dtype != torch.bool or mask.shape != (len(ctx.cohort), self.n):
            raise ProtocolError(f"Sub-FedAvg: the clients' masks must be bool [{len(ctx.cohort)}, {self.n}]")
        self._keep(mask.to(self.table.device), ctx)

    # ---- server side ------------------------------------------------------------
    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        count = self._round.get("count") if self._round.get("round") == ctx.round else None
        if count is None:
            raise RuntimeError("Sub-FedAvg: the server step ran without this round's client masks")
        delta = torch.where(count > 0, agg.to(torch.float32) / count.clamp_min(1), torch.zeros_like(count))
        if self.personal_eval and self.fed is not None:
            self._personal_metrics(ctx, ctx.global_params + delta, self._round["masks"])
        self._round = {}
        return delta

    @torch.no_grad()
    def _personal_metrics(self, ctx: RoundContext, w: torch.Tensor, masks: torch.Tensor) -> None:
        x, y = self.fed.x_test[self._eval_idx], self.fed.y_test[self._eval_idx]
        x = as_model_input(x)
        k = len(ctx.cohort)
        yk = y.reshape(-1)
        own = torch.stack([torch.isin(yk, torch.unique(self.fed.y[torch.from_numpy(self.fed.clients[c]).to(y.device)]
                                                       .reshape(-1)))
                           for c in ctx.cohort])  # [k, B]: test samples of the client's labels
        accs = []
        mods = [m for m in (self.cohort_model.model, self.cohort_model.gm) if m is not None]
        modes = [m.training for m in mods]
        for m in mods:
            m.eval()  # dropout off
        try:
            outs = [self.cohort_model.forward(params, x.unsqueeze(0).expand(k, *x.shape).contiguous())
                    for params in (w * masks, w.expand(k, -1).contiguous())]
        finally:
            for m, mode in zip(mods, modes):
                m.train(mode)
        for out in outs:
            if self.fed.task == "binary":
                pred = (out.reshape(k, -1) > 0).to(yk.dtype)
            else:
                pred = out.argmax(-1).view(k, -1)
            right = (pred == yk[None]) & own
            accs.append(float((right.sum(1) / own.sum(1).clamp_min(1)).mean()))
        ctx.metrics["personal_accuracy"], ctx.metrics["personal_global_accuracy"] = accs

    def state_dict(self) -> dict[str, Any]:
        return {"masks": self.table.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.table is None:
            self._pending = state
            return
        self.table.load_state_dict(state["masks"])
        self._round = {}

    def describe(self) -> str:
        return f"sub-fedavg(sparsity={self.sparsity}, prune_rate={self.prune_rate})"
