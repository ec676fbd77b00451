"""Run one model for a whole cohort at once: parameters [k, n], inputs [k, B, ...].

Fast path: the model is traced with torch.fx; activations keep the clients merged in the
batch axis ([k·B, ...]) so parameter-free ops (ReLU, pooling, flatten, dropout, means) run
unchanged, while each parametric layer uses the batched form of its own math:
Conv2d → one grouped convolution (groups = k, channels-last), Linear → one batched matmul.
Autograd of the summed per-client losses gives every client's own gradient.

Fallback: `torch.func.vmap` over `functional_call`, for models with layers the fast path
does not know (LSTM, Embedding, ...). Both give the same numbers up to float rounding.
"""

from __future__ import annotations


import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl.engine.flat import FlatParams

_PARAMETRIC = (nn.Conv2d, nn.Linear)


def _traceable(model: nn.Module) -> fx.GraphModule | None:
    try:
        gm = fx.symbolic_trace(model)
    except Exception:
        return None
    mods = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            return None
        if node.op == "call_module":
            m = mods[node.target]
            if any(True for _ in m.parameters(recurse=False)) and not isinstance(m, _PARAMETRIC):
                return None
            if isinstance(m, nn.Conv2d) and (m.padding_mode != "zeros" or isinstance(m.padding, str)):
                return None
    return gm


def loss_per_sample(out: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    if task == "binary":
        return F.binary_cross_entropy_with_logits(out.reshape(-1), y.reshape(-1).to(out.dtype), reduction="none")
    return F.cross_entropy(out, y.reshape(-1), reduction="none")


class CohortModel:
    """Forward and per-client gradients of `model` for k parameter vectors at once."""

    def __init__(self, model: nn.Module, task: str = "multiclass", mode: str = "auto"):
        self.model = model
        self.task = task
        self.flat = FlatParams(model)
        self.gm = _traceable(model) if mode in ("auto", "fx") else None
        if mode == "fx" and self.gm is None:
            raise ValueError("model cannot be traced for the fx cohort path")
        self.mode = "fx" if self.gm is not None else "vmap"
        if self.gm is not None:
            self._mods = dict(self.gm.named_modules())
            self._prefix = {id(m): name for name, m in self.gm.named_modules()}

    # ---- fx fast path -------------------------------------------------------------
    def _forward_fx(self, views: dict[str, torch.Tensor], x: torch.Tensor, k: int) -> torch.Tensor:
        env: dict[fx.Node, object] = {}

        def load(a):
            return fx.graph.map_arg(a, lambda n: env[n])

        out = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = x
            elif node.op == "call_module":
                mod = self._mods[node.target]
                (arg,) = load(node.args)
                if isinstance(mod, nn.Conv2d):
                    env[node] = _conv(mod, views[node.target + ".weight"],
                                      views.get(node.target + ".bias"), arg, k)
                elif isinstance(mod, nn.Linear):
                    env[node] = _linear(views[node.target + ".weight"], views.get(node.target + ".bias"), arg, k)
                else:
                    env[node] = mod(arg, **load(node.kwargs))
            elif node.op == "call_function":
                env[node] = node.target(*load(node.args), **load(node.kwargs))
            elif node.op == "call_method":
                self_obj, *rest = load(node.args)
                env[node] = getattr(self_obj, node.target)(*rest, **load(node.kwargs))
            elif node.op == "output":
                out = load(node.args[0])
        return out

    def forward(self, pflat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Outputs [k·B, ...] for params [k, n] and inputs [k, B, ...]."""
        k, b = x.shape[:2]
        if self.mode == "fx":
            return self._forward_fx(self.flat.views(pflat), x.reshape(k * b, *x.shape[2:]), k)

        def one(p, xx):
            return functional_call(self.model, self.flat.views(p), (xx,))

        out = vmap(one, randomness="different")(pflat, x)
        return out.reshape(k * b, *out.shape[2:])

    def client_losses(self, pflat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                      weight: torch.Tensor | None = None) -> torch.Tensor:
        """Mean loss of each client over its batch, [k]. `weight` [k, B] masks padded samples."""
        k, b = x.shape[:2]
        per = loss_per_sample(self.forward(pflat, x), y, self.task).view(k, b)
        if weight is None:
            return per.mean(1)
        return (per * weight).sum(1) / weight.sum(1).clamp_min(1)

    def client_grads(self, pflat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                     sign: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Each client's gradient of its mean batch loss, [k, n] (times `sign` [k] if given)."""
        return torch.cat([g.reshape(g.shape[0], -1) for g in self.client_grad_parts(pflat, x, y, sign, weight)], 1)

    def client_grad_parts(self, pflat: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                          sign: torch.Tensor | None = None, weight: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Like `client_grads`, one tensor [k, *shape] per parameter (no flat copy)."""
        if self.mode == "vmap":
            def f(p, xx, yy, ww):
                out = functional_call(self.model, self.flat.views(p), (xx,))
                per = loss_per_sample(out, yy, self.task)
                return (per * ww).sum() / ww.sum().clamp_min(1)

            w = weight if weight is not None else torch.ones(x.shape[:2], dtype=torch.float32, device=x.device)
            g = vmap(grad(f), randomness="different")(pflat, x, y, w)
            if sign is not None:
                g = g * sign[:, None]
            return list(self.flat.views(g).values())
        # leaves are per-parameter views of pflat: autograd then never materialises a full [k, n] zero tensor
        leaves = {n: v.detach().requires_grad_(True) for n, v in self.flat.views(pflat).items()}
        k, b = x.shape[:2]
        out = self._forward_fx(leaves, x.reshape(k * b, *x.shape[2:]), k)
        per = loss_per_sample(out, y, self.task).view(k, b)
        losses = per.mean(1) if weight is None else (per * weight).sum(1) / weight.sum(1).clamp_min(1)
        total = (losses * sign).sum() if sign is not None else losses.sum()
        return list(torch.autograd.grad(total, list(leaves.values())))


def _conv(mod: nn.Conv2d, w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, k: int) -> torch.Tensor:
    kb, c, h, wd = x.shape
    bsz = kb // k
    xg = x.view(k, bsz, c, h, wd).transpose(0, 1).reshape(bsz, k * c, h, wd)
    xg = xg.contiguous(memory_format=torch.channels_last)
    wg = w.reshape(k * w.shape[1], *w.shape[2:]).contiguous(memory_format=torch.channels_last)
    out = F.conv2d(xg, wg, None if b is None else b.reshape(-1), mod.stride, mod.padding, mod.dilation,
                   groups=k * mod.groups)
    co, ho, wo = out.shape[1] // k, out.shape[2], out.shape[3]
    return out.view(bsz, k, co, ho, wo).transpose(0, 1).reshape(kb, co, ho, wo)


def _linear(w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, k: int) -> torch.Tensor:
    # out^T = W x^T keeps dL/dW = dOut^T x contiguous in W's own layout (no transposed copy of a big grad)
    lead = x.shape[:-1]
    xb = x.reshape(k, -1, x.shape[-1])
    out = torch.bmm(w, xb.transpose(1, 2)).transpose(1, 2)
    if b is not None:
        out = out + b.unsqueeze(1)
    return out.reshape(*lead, w.shape[1])
