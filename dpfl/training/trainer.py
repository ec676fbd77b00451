"""Local client training for a whole cohort at once (and a sequential reference path)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dpfl.data.dataset import as_model_input
from dpfl.dpsgd.core import clipped_grad_sum
from dpfl.errors import ConfigError
from dpfl.rng import CryptoRNG, gaussian_rows
from dpfl.threads import for_each
from dpfl.training.cohort import CohortModel, LowRank


@dataclass
class LocalTraining:
    """Hyper-parameters of the clients' local optimisation (thesis Alg. 2 by default)."""

    steps: int = 5  # T_gd
    batch_size: int = 10  # |B|
    lr: float = 0.215  # η
    optimizer: str = "sgd"  # "sgd" | "adam" (Keras 2.2 form: ε added before bias correction, as the thesis ran)
    momentum: float = 0.0
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-7  # Keras default
    prox_mu: float = 0.0  # FedProx proximal term μ/2·‖w − w_global‖²


@dataclass
class ClientDP:
    """DP-SGD inside local training (record-level DP) for the k rows of one round's cohort.

    Row c's step t uses the records `batches[c, t, j]` with `weight[c, t, j] = 1` (0: padding of a
    Poisson batch to the fixed size B_max): every example's gradient is clipped to `clip`, the
    clipped sum gets N(0, σ²·clip²) noise from `rngs[c]` and is divided by `expected[c]` = q_c·n_c
    (`dpfl.dpsgd.core` semantics). Optimizer, weight decay, prox and masks then act on that
    noisy gradient (post-processing)."""

    clip: float
    noise_multiplier: float
    weight: torch.Tensor  # [k, T, B_max] float
    expected: torch.Tensor  # [k] expected batch size of each row
    rngs: list[CryptoRNG]  # one noise stream per row
    chunk: int = 0  # rows per per-example-gradient call (memory); 0 = all

    def rows(self, rows: slice) -> ClientDP:
        return ClientDP(self.clip, self.noise_multiplier, self.weight[rows], self.expected[rows],
                        self.rngs[rows], self.chunk)


GradHook = Callable[[int, slice, torch.Tensor, torch.Tensor, dict, dict], None]
"""``grad_hook(t, rows, xb, yb, params, grads)``: called once per local step t with the cohort rows
being trained (`rows`, a slice of the full cohort: the trainer may split a cohort into chunks),
their batch's inputs `xb` [k', B, ...] and labels `yb` [k', B], the current parameters
``{name: [k', *shape]}`` and the loss gradients ``{name: [k', *shape]}``, which it may change in
place (per-client gradient corrections: FedDyn's linear term, SVRG's control variate, per-client
step sizes). Not called on the default
path; when given, the low-rank fast path is off (every parameter is dense)."""


class Trainer:
    """Trains k copies of one model (from the same or per-client starting points) on k clients' batches."""

    def __init__(self, model: nn.Module, task: str, cfg: LocalTraining, mode: str = "auto",
                 max_cohort: int = 0, lowrank: bool = True):
        self.model = model
        self.task = task
        self.cfg = cfg
        self.cohort = CohortModel(model, task, mode)
        self.flat = self.cohort.flat
        self.max_cohort = max_cohort  # split larger cohorts into chunks (memory); 0 = no limit
        self.lowrank = lowrank  # plain SGD: keep big Linear weights as W_0 − η·Σ GᵀX (see cohort.py)

    def train(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batches: torch.Tensor,
              mask: torch.Tensor | None = None, sign: torch.Tensor | None = None,
              grad_hook: GradHook | None = None, dp: ClientDP | None = None) -> torch.Tensor:
        """Updates Δw [k, n] after local training.

        `batches` [k, T, B] indexes rows of `x`/`y` (each client's own samples);
        `w` [n] is every client's starting point, or [k, n] one per client (personalised models;
        Δw is then measured from each client's own start);
        `mask` bool [n], or [k, n] per client: only these coordinates move (the others stay at
        their start: Top-K reset rule, pruned sub-networks);
        `sign` [k]: +1 for descent, −1 for gradient ascent (attacks);
        `grad_hook(t, rows, xb, yb, params, grads)`: optional per-client change of each step's loss
        gradient, in place, before weight decay / prox / mask / optimizer (see `GradHook`);
        `dp`: DP-SGD local steps (record-level DP, see `ClientDP`; `batches` is then [k, T, B_max]).
        """
        k = batches.shape[0]
        if self.max_cohort and k > self.max_cohort:
            parts = []
            for s in range(0, k, self.max_cohort):
                rows = slice(s, min(k, s + self.max_cohort))
                parts.append(self._train(w, x, y, batches, mask, sign, grad_hook, rows, dp))
            return torch.cat(parts)
        return self._train(w, x, y, batches, mask, sign, grad_hook, slice(0, k), dp)

    def _train(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batches: torch.Tensor,
               mask: torch.Tensor | None, sign: torch.Tensor | None, grad_hook: GradHook | None,
               rows: slice, dp: ClientDP | None = None) -> torch.Tensor:
        """Local training of the cohort rows `rows` (all per-client arguments are full-cohort)."""
        if dp is not None and grad_hook is not None:
            raise ConfigError("train.dpsgd does not combine with per-client gradient corrections "
                              "(FedDyn, FSVRG, ...): their gradients would bypass the clipping")
        if rows != slice(0, batches.shape[0]):
            batches = batches[rows]
            dp = None if dp is None else dp.rows(rows)
            sign = None if sign is None else sign[rows]
            w = w[rows] if w.dim() == 2 else w
            mask = mask[rows] if mask is not None and mask.dim() == 2 else mask
        k = batches.shape[0]
        cfg = self.cfg
        if cfg.optimizer not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {cfg.optimizer!r}; allowed: sgd, adam")
        per_client = w.dim() == 2
        plain_sgd = (cfg.optimizer == "sgd" and not cfg.momentum and not cfg.weight_decay and not cfg.prox_mu
                     and mask is None and grad_hook is None and not per_client and self.lowrank and dp is None)
        low_names = set(self.cohort.lowrank_candidates(batches.shape[1] * batches.shape[2])) if plain_sgd else set()
        w_parts = self.flat.views(w)
        params: dict[str, object] = {}
        for name, v in w_parts.items():
            if name in low_names:
                params[name] = LowRank(v, cfg.lr)
            else:
                params[name] = v.clone() if per_client else v.expand(k, *v.shape).clone()
        m_parts = {} if mask is None else {n: v.to(w.dtype) for n, v in self.flat.views(mask).items()}
        use_m1 = cfg.optimizer == "adam" or cfg.momentum > 0
        dense = [n for n in params if n not in low_names]
        m1 = {n: torch.zeros_like(params[n]) for n in dense} if use_m1 else None
        m2 = {n: torch.zeros_like(params[n]) for n in dense} if cfg.optimizer == "adam" else None
        dp_out = None if dp is None else {n: torch.empty_like(params[n]) for n in dense}  # reused every step
        for t in range(batches.shape[1]):
            idx = batches[:, t]
            xb, yb = x[idx], y[idx]
            xb = as_model_input(xb, w.dtype)
            if dp is not None:
                grads = self._dp_grads({n: params[n] for n in dense}, xb, yb, dp, t, sign, dp_out)
            elif self.cohort.mode == "fx":
                grads = self.cohort.grads(params, xb, yb, sign)
            else:
                stacked = torch.cat([params[n].reshape(k, -1) for n in dense], 1)
                grads = dict(zip(dense, self.cohort.client_grad_parts(stacked, xb, yb, sign)))
            if grad_hook is not None:
                grad_hook(t, rows, xb, yb, params, grads)
            for n in dense:
                q, g = params[n], grads[n]
                if cfg.weight_decay:
                    g.add_(q, alpha=cfg.weight_decay)
                if cfg.prox_mu:
                    g.add_(q - w_parts[n], alpha=cfg.prox_mu)
                if n in m_parts:
                    g.mul_(m_parts[n])
                if cfg.optimizer == "adam":
                    b1, b2 = cfg.adam_betas
                    m1[n].mul_(b1).add_(g, alpha=1 - b1)
                    m2[n].mul_(b2).addcmul_(g, g, value=1 - b2)
                    step = cfg.lr * (1 - b2 ** (t + 1)) ** 0.5 / (1 - b1 ** (t + 1))
                    q.addcdiv_(m1[n], m2[n].sqrt().add_(cfg.adam_eps), value=-step)
                else:
                    if m1 is not None:
                        m1[n].mul_(cfg.momentum).add_(g)
                        g = m1[n]
                    q.add_(g, alpha=-cfg.lr)
        d = torch.empty(k, self.flat.n, dtype=w.dtype, device=w.device)
        for name, dv in self.flat.views(d).items():
            q = params[name]
            if isinstance(q, LowRank):
                q.delta(dv)
            else:
                torch.sub(q, w_parts[name], out=dv)
        return d

    def _dp_grads(self, params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, dp: ClientDP,
                  t: int, sign: torch.Tensor | None, out: dict[str, torch.Tensor] | None = None
                  ) -> dict[str, torch.Tensor]:
        """Noisy clipped gradients {name: [k, *shape]} of step t: the clipped sums of the whole cohort
        by book-keeping (`CohortModel.clipped_sums`) where the model allows it, else per-(client,
        example) gradients by `clipped_grad_sum` vmapped over the clients (in chunks of `dp.chunk`
        rows); then noise per row from the row's own stream."""
        k = xb.shape[0]
        parts = None
        step = self.cohort.bookkeeping_rows(xb.shape[1])
        if step:
            if out is None or any(out[n].shape != v.shape for n, v in params.items()):
                out = {n: torch.empty_like(v, memory_format=torch.contiguous_format) for n, v in params.items()}
            parts = [self.cohort.clipped_sums({n: v[s:s + step] for n, v in params.items()}, xb[s:s + step],
                                              yb[s:s + step], dp.clip, dp.weight[s:s + step, t],
                                              out={n: v[s:s + step] for n, v in out.items()})
                     for s in range(0, k, step)]
            parts = None if any(p is None for p in parts) else [out]
        if parts is None:
            loss = "bce" if self.task == "binary" else "ce"
            buffers = {n: b.detach() for n, b in self.model.named_buffers()}

            def one(p, xx, yy, mm):
                return clipped_grad_sum(p, buffers, self.model, xx, yy, clip=dp.clip, loss=loss, mask=mm)

            step = dp.chunk or k
            parts = [torch.func.vmap(one, randomness="different")(
                {n: v[s:s + step] for n, v in params.items()}, xb[s:s + step], yb[s:s + step],
                dp.weight[s:s + step, t]) for s in range(0, k, step)]
        grads = {n: torch.cat([p[n] for p in parts]) if len(parts) > 1 else parts[0][n] for n in params}
        dtypes = {g.dtype for g in grads.values()}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float64
        total = sum(g[0].numel() for g in grads.values())
        if xb.device.type != "cpu":  # every row's noise at once, where the gradients are
            noise = torch.empty(k, total, dtype=dtype, device=xb.device)
            if dp.noise_multiplier > 0:
                gaussian_rows([dp.rngs[c] for c in range(k)], noise, dp.noise_multiplier * dp.clip)
            self._add_noise(grads, noise, range(k), dp, sign)
            return grads
        bufs = [torch.empty(total, dtype=dtype) for _ in range(min(k, max(1, torch.get_num_threads())))]

        def draw(j: int, c: int) -> None:  # the values of gaussian_like(row c's grads, σC, rngs[c]), on the CPU
            dp.rngs[c].gaussian_into(bufs[j], dp.noise_multiplier * dp.clip)

        # (Σ clipped + noise from the row's own stream) / L, as dpsgd.core.noisy_gradient; each row's
        # noise comes from its own generator, so drawing rows in threads changes only the wall time
        for s in range(0, k, len(bufs)):
            rows = range(s, min(k, s + len(bufs)))
            if dp.noise_multiplier > 0:
                for_each(len(rows), lambda j, s=s: draw(j, s + j), threads=len(bufs))
            self._add_noise(grads, bufs, rows, dp, sign)
        return grads

    @staticmethod
    def _add_noise(grads, noise, rows, dp, sign) -> None:
        """grads[c] ← (grads[c] + noise row) / L_c, times the row's sign; noise[j] for rows[j]."""
        for j, c in enumerate(rows):
            i, scale = 0, float(dp.expected[c])
            for g in grads.values():
                gc = g[c]
                if dp.noise_multiplier > 0:
                    gc.add_(noise[j][i:i + gc.numel()].to(gc.device).view(gc.shape))
                    i += gc.numel()
                gc.div_(scale)
                if sign is not None:
                    gc.mul_(float(sign[c]))

    def train_sequential(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batches: torch.Tensor,
                         mask: torch.Tensor | None = None, sign: torch.Tensor | None = None,
                         grad_hook: GradHook | None = None, dp: ClientDP | None = None) -> torch.Tensor:
        """Reference path: one client at a time (same math, no cohort batching)."""
        return torch.cat([self._train(w, x, y, batches, mask, sign, grad_hook, slice(c, c + 1), dp)
                          for c in range(batches.shape[0])])
