"""FSVRG (Konečný et al. 2016 as the survey's §2.4.4 / Nilsson et al. describe it; notes §1.7).

FSVRG = [FSVRGStep(h, B)] | PlainTransport(float32) | data-size-weighted mean, local plain SGD with lr = h

Round t, from the global model w_t:

1. every answering client k computes its full local gradient ∇f_k(w_t) (mean over its n_k
   samples) and uploads it; the server forms the full gradient over the round's data
   ∇f(w_t) = Σ_k n_k ∇f_k(w_t) / Σ_k n_k and sends it back (the expensive step, done once);
2. client k makes one pass over a random permutation of its data in m_k = ⌈n_k / B⌉ steps
   (B = 1: one SVRG update per data point) with step size h_k = h / m_k (= h / n_k for B = 1):

       w ← w − h_k (∇f_b(w) − ∇f_b(w_t) + ∇f(w_t))          (b: the step's mini-batch)

3. the server averages the clients' models weighted by n_k (the notes' allowed simplification of
   Konečný's w_{t+1} = w_t + A Σ_k n_k/n (w_k − w_t); the diagonal A and S_k are defined for sparse
   linear models' features and have no counterpart for dense network weights).

Vectorised: the cohort trains together for T = max_k m_k steps; the `grad_hook` replaces each
step's gradient by the SVRG one scaled by 1/m_k, and by zero after client k's pass, so client k
makes exactly its m_k updates. ∇f_b(w_t) costs one more cohort forward/backward per step (SVRG's
usual 2 gradients per step). Bytes: each client uploads its update and its local gradient (2n
floats, both counted by the transport), and downloads the model and the full gradient (2n floats).
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.schemes.base import ClientPlan, RoundContext, SetupContext, Step
from dpfl.schemes.sampling import local_positions

GRAD_SAMPLES = 8192  # samples per chunk of the round-start full-gradient pass


class FSVRGStep(Step):
    """Round-start full gradient, SVRG local steps (via the trainer's grad hook), gradient upload."""

    name = "fsvrg"
    changes_local_training = True
    deploy_note = "its clients need the round's full gradient: a second exchange after they upload theirs"

    def __init__(self, h: float, batch_size: int = 1):
        self.h = float(h)
        self.batch_size = int(batch_size)
        self._round: tuple[int, torch.Tensor] | None = None  # (round, local gradients [k, n])
        self._full: torch.Tensor | None = None  # this round's ∇f(w_t), broadcast to the cohort

    def setup(self, ctx: SetupContext) -> None:
        self.fed = ctx.clients  # x, y, clients (index arrays), sizes
        self.cohort_model = ctx.trainer.cohort
        self.flat = ctx.trainer.flat
        self.n = ctx.n_params

    def _x(self, idx: torch.Tensor) -> torch.Tensor:
        xb = self.fed.x[idx]
        return xb.to(torch.float32) if xb.dtype in (torch.uint8, torch.float16, torch.bfloat16) else xb

    def local_gradients(self, w: torch.Tensor, cohort: np.ndarray) -> torch.Tensor:
        """∇f_k(w) for each client of `cohort`: mean loss gradient over all its data, [k, n]."""
        sizes = self.fed.sizes[cohort]
        b = int(sizes.max())
        per = max(1, GRAD_SAMPLES // b)
        out = torch.empty(len(cohort), self.n, dtype=torch.float32, device=w.device)
        for s in range(0, len(cohort), per):
            part = cohort[s : s + per]
            idx = np.zeros((len(part), b), dtype=np.int64)
            weight = np.zeros((len(part), b), dtype=np.float32)
            for i, c in enumerate(part):
                rows = self.fed.clients[c]
                idx[i, : len(rows)], idx[i, len(rows) :] = rows, rows[0]
                weight[i, : len(rows)] = 1
            idx_t = torch.from_numpy(idx).to(w.device)
            wk = w.expand(len(part), self.n).contiguous()
            out[s : s + len(part)] = self.cohort_model.client_grads(
                wk, self._x(idx_t), self.fed.y[idx_t], weight=torch.from_numpy(weight).to(w.device))
        return out

    def local_training(self, ctx: RoundContext) -> ClientPlan:
        cohort, w = ctx.cohort, ctx.global_params
        sizes = self.fed.sizes[cohort]
        local = self.local_gradients(w, cohort)  # uploaded by the clients
        self._round = (ctx.round, local)
        wts = torch.from_numpy(sizes.astype(np.float64)).to(w.device)
        full = ((wts / wts.sum()) @ local.double()).to(torch.float32)  # ∇f(w_t), sent back to the clients
        self._full = full
        full_parts = self.flat.views(full)
        steps = -(-sizes // self.batch_size)  # m_k
        t_max = int(steps.max())
        pos = local_positions(sizes, t_max, self.batch_size, ctx.numpy_rng("batches"))
        batches = torch.from_numpy(np.stack([self.fed.clients[c][p] for c, p in zip(cohort, pos)])).to(w.device)
        m_k = torch.from_numpy(steps.astype(np.float32)).to(w.device)
        w_start = w.expand(len(cohort), self.n).contiguous()
        names = list(full_parts)

        def svrg(t: int, rows: slice, idx: torch.Tensor, params: dict, grads: dict) -> None:
            at_start = self.cohort_model.client_grad_parts(w_start[rows], self._x(idx), self.fed.y[idx])
            coef = (t < m_k[rows]).to(torch.float32) / m_k[rows]  # h_k / h while client k's pass lasts
            for name, g0 in zip(names, at_start):
                g = grads[name]
                g.sub_(g0).add_(full_parts[name]).mul_(coef.view(-1, *([1] * (g.dim() - 1))))

        return ClientPlan(batches=batches, grad_hook=svrg)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """Each client's payload: its update and (sent first, in the protocol) its local gradient."""
        if self._round is None or self._round[0] != ctx.round:
            raise RuntimeError("FSVRG: the client chain ran without this round's local gradients")
        local = self._round[1]
        self._round = None
        return torch.cat([u, local.to(u.dtype)], 1)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return agg[: ctx.n_params]

    def downstream_bytes(self, ctx: RoundContext) -> int:
        from dpfl.schemes.registry import float32_nbytes

        model = float32_nbytes(ctx.global_params)
        if self._round is None or self._round[0] != ctx.round:  # nobody answered: only the model went out
            return model
        return model + float32_nbytes(self._full)  # the model, then ∇f(w_t)

    def describe(self) -> str:
        return f"fsvrg(h={self.h}, B={self.batch_size})"
