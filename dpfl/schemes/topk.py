"""FL-TOP (thesis Alg. 7–8): a fixed Top-K coordinate set chosen by the server on public data.

FL-TOP = [TopKStep(r)] | PlainTransport(float32) | MeanAggregator

Setup: from w_0, T_init SGD steps on the public batch; T = the K coordinates with the largest
accumulated |gradient|. Every round local training may change only T (`train_mask`; the
others are reset after every step, so they stay at w_0), clients send the K update values and
download the K current weights (the rest is w_0, generated from the shared seed).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from dpfl.compression.base import Float32Codec
from dpfl.compression.subset import count_for_ratio, gather, scatter
from dpfl.compression.topk import accumulated_abs_grad, topk_indices
from dpfl.errors import ConfigError
from dpfl.schemes.base import RoundContext, SetupContext, Step

TASKS = ("multiclass", "binary")


def _model_grad_fn(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str):
    """∇ of the mean batch loss at a flat parameter vector (named_parameters order)."""
    names = [(name, p.shape, p.numel()) for name, p in model.named_parameters()]

    def grad_fn(w: torch.Tensor) -> torch.Tensor:
        w = w.detach().requires_grad_(True)
        params, off = {}, 0
        for name, shape, size in names:
            params[name] = w[off : off + size].view(shape)
            off += size
        out = functional_call(model, params, (x,))
        if task == "binary":
            loss = F.binary_cross_entropy_with_logits(out.reshape(-1), y.reshape(-1).to(out.dtype))
        else:
            loss = F.cross_entropy(out, y.reshape(-1))
        (g,) = torch.autograd.grad(loss, w)
        return g

    return grad_fn


class TopKStep(Step):
    """Top-K set from public data; trains, sends and downloads only those K coordinates."""

    name = "topk"

    def __init__(self, ratio: float, init_steps: int = 5, init_lr: float = 0.215, task: str = "multiclass"):
        if task not in TASKS:
            raise ConfigError(f"FL-TOP task must be one of {TASKS}, got {task!r}")
        self.ratio, self.init_steps, self.init_lr, self.task = ratio, int(init_steps), float(init_lr), task
        self.indices: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None

    def setup(self, ctx: SetupContext) -> None:
        if self.indices is not None:  # restored from a checkpoint
            self._set(self.indices.to(ctx.device), ctx.n_params)
            return
        if ctx.public_data is None:
            raise ConfigError("FL-TOP needs public data to pick its Top-K set (SetupContext.public_data is None)")
        x, y = (t.to(ctx.device) for t in ctx.public_data)
        cohort = getattr(ctx.trainer, "cohort", None)
        if cohort is not None:  # the engine's model runner: per-client gradients of the mean batch loss
            def grad_fn(w):
                return cohort.client_grads(w.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0))[0]
        elif ctx.model is not None:
            grad_fn = _model_grad_fn(ctx.model, x.float() if x.dtype == torch.uint8 else x, y, self.task)
        else:
            raise ConfigError("FL-TOP setup needs SetupContext.trainer or SetupContext.model to compute gradients")
        scores = accumulated_abs_grad(grad_fn, ctx.initial_params, self.init_steps, self.init_lr)
        k = count_for_ratio(self.ratio, ctx.n_params)
        self._set(topk_indices(scores, k).to(ctx.device), ctx.n_params)

    def _set(self, idx: torch.Tensor, n: int) -> None:
        self.indices = idx
        self._mask = torch.zeros(n, dtype=torch.bool, device=idx.device)
        self._mask[idx] = True

    def train_mask(self, ctx: RoundContext) -> torch.Tensor:
        return self._mask

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return gather(u, self.indices)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return scatter(agg.to(torch.float32), self.indices, ctx.n_params)

    def downstream_bytes(self, ctx: RoundContext) -> int:
        """Measured: the payload of the K current weights one client downloads."""
        values = gather(ctx.global_params, self.indices).unsqueeze(0)
        return int(Float32Codec().encode(values).per_client_nbytes()[0])

    def state_dict(self) -> dict[str, Any]:
        return {"indices": self.indices.cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        idx = state["indices"].clone()
        if self._mask is not None:  # after setup: replace the set now
            self._set(idx.to(self._mask.device), self._mask.numel())
        else:  # before setup: setup keeps it instead of recomputing
            self.indices = idx

    def describe(self) -> str:
        return f"topk(r={self.ratio}, T_init={self.init_steps})"
