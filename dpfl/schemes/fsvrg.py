"""FSVRG (Konečný et al. 2016 as the survey's §2.4.4 / Nilsson et al. describe it; notes §1.7).

FSVRG = [FSVRGStep(h, B)] | PlainTransport(float32) | data-size-weighted mean, local plain SGD with lr = h

Round t, from the global model w_t:

1. every answering client k computes its full local gradient ∇f_k(w_t) (mean over its n_k
   samples) and uploads it; the server forms the full gradient over the round's data
   ∇f(w_t) = Σ_k n_k ∇f_k(w_t) / Σ_k n_k and sends it back (the expensive step, done once).
   This is the step's round statistic (`Step.round_statistic`): `client_statistic` and
   `combine_statistic`, run by `dpfl.schemes.round.run_round` in process or as a first exchange
   with deployed clients;
2. client k makes one pass over a random permutation of its data in m_k = ⌈n_k / B⌉ steps
   (B = 1: one SVRG update per data point) with step size h_k = h / m_k (= h / n_k for B = 1):

       w ← w − h_k (∇f_b(w) − ∇f_b(w_t) + ∇f(w_t))          (b: the step's mini-batch)

3. the server averages the clients' models weighted by n_k (the notes' allowed simplification of
   Konečný's w_{t+1} = w_t + A Σ_k n_k/n (w_k − w_t); the diagonal A and S_k are defined for sparse
   linear models' features and have no counterpart for dense network weights).

Vectorised: the cohort trains together for T = max_k m_k steps (the scheme is `one_pass`); the
`grad_hook` replaces each step's gradient by the SVRG one scaled by 1/m_k, and by zero after
client k's pass, so client k makes exactly its m_k updates. ∇f_b(w_t) costs one more cohort
forward/backward per step (SVRG's usual 2 gradients per step). Bytes: each client uploads its
local gradient and its update (2n floats), and downloads the model and the full gradient (2n
floats); the round counts the statistic's share of both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpfl.data.dataset import as_model_input
from dpfl.schemes.base import ClientPlan, RoundContext, SetupContext, Step

GRAD_SAMPLES = 8192  # samples per chunk of the round-start full-gradient pass


class FSVRGStep(Step):
    """Round-start full gradient (the round statistic), SVRG local steps via the trainer's grad hook."""

    name = "fsvrg"
    changes_local_training = True
    round_statistic = True  # ∇f(w_t) of the round's clients, before their local pass

    def __init__(self, h: float, batch_size: int = 1):
        self.h = float(h)
        self.batch_size = int(batch_size)

    def setup(self, ctx: SetupContext) -> None:
        self.cohort_model = ctx.trainer.cohort
        self.flat = ctx.trainer.flat

    def client_statistic(self, ctx: RoundContext, x: torch.Tensor, y: torch.Tensor,
                         rows: Sequence[np.ndarray]) -> torch.Tensor:
        """∇f_k(w_t) of each listed client: its mean loss gradient over all its samples, [k, n]."""
        w, n = ctx.global_params, ctx.n_params
        b = max(len(r) for r in rows)
        per = max(1, GRAD_SAMPLES // b)
        out = torch.empty(len(rows), n, dtype=torch.float32, device=w.device)
        for s in range(0, len(rows), per):
            part = rows[s : s + per]
            idx = np.zeros((len(part), b), dtype=np.int64)
            weight = np.zeros((len(part), b), dtype=np.float32)
            for i, r in enumerate(part):
                idx[i, : len(r)], idx[i, len(r) :] = r, r[0]
                weight[i, : len(r)] = 1
            idx_t = torch.from_numpy(idx).to(w.device)
            xb = x[idx_t]
            xb = as_model_input(xb)
            wk = w.expand(len(part), n).contiguous()
            out[s : s + len(part)] = self.cohort_model.client_grads(
                wk, xb, y[idx_t], weight=torch.from_numpy(weight).to(w.device))
        return out

    def combine_statistic(self, rows: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """∇f(w_t) = Σ_k n_k ∇f_k(w_t) / Σ_k n_k over the answering clients (float64 sum)."""
        wts = ctx.weights.to(torch.float64)
        return ((wts / wts.sum()) @ rows.double()).to(torch.float32)

    def local_training(self, ctx: RoundContext) -> ClientPlan:
        if ctx.statistic is None:
            raise RuntimeError("FSVRG: local training ran without the round's full gradient (ctx.statistic)")
        w, k = ctx.global_params, len(ctx.cohort)
        full_parts = self.flat.views(ctx.statistic)
        sizes = ctx.weights.to(torch.int64)  # n_k
        m_k = torch.div(sizes + self.batch_size - 1, self.batch_size, rounding_mode="floor").to(torch.float32)
        w_start = w.expand(k, ctx.n_params).contiguous()
        names = list(full_parts)

        def svrg(t: int, rows: slice, xb: torch.Tensor, yb: torch.Tensor, params: dict, grads: dict) -> None:
            at_start = self.cohort_model.client_grad_parts(w_start[rows], xb, yb)
            coef = (t < m_k[rows]).to(torch.float32) / m_k[rows]  # h_k / h while client k's pass lasts
            for name, g0 in zip(names, at_start):
                g = grads[name]
                g.sub_(g0).add_(full_parts[name]).mul_(coef.view(-1, *([1] * (g.dim() - 1))))

        return ClientPlan(grad_hook=svrg)

    def describe(self) -> str:
        return f"fsvrg(h={self.h}, B={self.batch_size})"
