"""FedDyn (Acar et al., ICLR 2021; survey notes §1.8): dynamic regularisation with stateful clients.

FEDDYN = [FedDynStep(α)] | PlainTransport(float32) | MeanAggregator, local training with prox_mu = α

Active client k in round t minimises, from θ^{t-1}, with the engine's local SGD steps,

    L_k(θ) − ⟨∇L_k(θ_k^{t-1}), θ⟩ + α/2 ‖θ − θ^{t-1}‖²

(the quadratic term is the trainer's proximal term `prox_mu = α`; the linear term is a per-client
gradient offset: `grad_hook` subtracts the client's stored gradient memory g_k at every step),
then updates its memory g_k ← g_k − α (θ_k^t − θ^{t-1}). Inactive clients keep theirs.
Server, with m = N clients in the federation and P_t the answering clients:

    h^t = h^{t-1} − α/m · Σ_{k∈P_t} (θ_k^t − θ^{t-1})
    θ^t = mean_{k∈P_t} θ_k^t − h^t / α          (delta = mean Δ_k − h^t/α)

The gradient memories live in a `ClientTable`: one row of n values per client *seen* (never
for clients not yet selected), n × 4 bytes each in float32 (`state_dtype = "float16"`: 2 bytes).
"""

from __future__ import annotations

from typing import Any

import torch

from dpfl.models.flat import FlatParams
from dpfl.schemes.base import ClientPlan, RoundContext, SetupContext, Step
from dpfl.schemes.client_state import ClientTable


class FedDynStep(Step):
    """Client: linear term from the gradient memory, memory update; server: h and the FedDyn model."""

    name = "feddyn"
    changes_local_training = True
    client_state = True  # a deployed client keeps its row on its node

    def __init__(self, alpha: float, dtype: torch.dtype = torch.float32):
        self.alpha = float(alpha)
        self.dtype = dtype
        self.table: ClientTable | None = None
        self.h: torch.Tensor | None = None
        self.m = 0
        self.flat: FlatParams | None = None
        self._pending: dict[str, Any] | None = None
        self._round: tuple[int, torch.Tensor] | None = None  # (round, this cohort's g rows, float32)

    def setup(self, ctx: SetupContext) -> None:
        self.flat = ctx.trainer.flat if ctx.trainer is not None else FlatParams(ctx.model)
        self.m = int(ctx.n_clients)
        self.table = ClientTable(ctx.n_params, self.dtype, ctx.device, fill=0.0, max_rows=self.m)
        self.h = torch.zeros(ctx.n_params, dtype=torch.float32, device=ctx.device)
        if self._pending is not None:  # restored before setup
            self.load_state_dict(self._pending)
            self._pending = None

    def memory(self, ctx: RoundContext) -> torch.Tensor:
        """∇L_k(θ_k^{t-1}) of the answering cohort, float32 [k, n] (zeros for first-time clients)."""
        if self._round is None or self._round[0] != ctx.round:
            self._round = (ctx.round, self.table.get(ctx.cohort).to(torch.float32))
        return self._round[1]

    def local_training(self, ctx: RoundContext) -> ClientPlan:
        views = self.flat.views(self.memory(ctx))

        def linear_term(t: int, rows: slice, xb: torch.Tensor, yb: torch.Tensor, params: dict,
                        grads: dict) -> None:
            for name, g in grads.items():
                g.sub_(views[name][rows])

        return ClientPlan(grad_hook=linear_term)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        g = self.memory(ctx)
        g.sub_(u.to(g.dtype), alpha=self.alpha)
        self.table.put(ctx.cohort, g)
        self._round = None
        return u

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        # agg = (1/|P_t|) Σ Δ_k, so Σ Δ_k = |P_t|·agg
        self.h.sub_(agg.to(self.h.dtype), alpha=self.alpha * ctx.k() / self.m)
        return agg - self.h / self.alpha

    def state_dict(self) -> dict[str, Any]:
        return {"h": self.h.cpu().clone(), "memory": self.table.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.table is None:
            self._pending = state
            return
        self.h = state["h"].to(self.h.device).clone()
        self.table.load_state_dict(state["memory"])
        self._round = None

    def describe(self) -> str:
        return f"feddyn(α={self.alpha})"
