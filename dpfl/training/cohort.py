"""Run one model for a whole cohort at once: parameters [k, n], inputs [k, B, ...].

Fast path: the model is traced with torch.fx; activations keep the clients merged in the
batch axis ([k·B, ...]) so parameter-free ops (ReLU, pooling, flatten, dropout, means) run
unchanged, while each parametric layer uses the batched form of its own math:
Conv2d → one grouped convolution (groups = k, channels-last), Linear → one batched matmul.
Autograd of the summed per-client losses gives every client's own gradient.

Low-rank dense layers: under plain SGD a client's Linear weight after t steps is
W_t = W_0 − η Σ_{j<t} G_jᵀ X_j (G_j: gradient of the loss w.r.t. the layer's output, X_j: its
input). `LowRank` keeps only (X_j, G_j), so X W_tᵀ = X W_0ᵀ − η (X X_hᵀ) G_h is one shared GEMM
plus small per-client products, and no per-client weight (or weight gradient) is ever stored:
the client update −η G_hᵀ X_h is formed once at the end. Exact up to float reassociation.

Fallback: `torch.func.vmap` over `functional_call`, for models with layers the fast path
does not know (LSTM, Embedding, ...). Both give the same numbers up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.func import functional_call, grad, vmap

from dpfl.dpsgd.core import _CLIP_MARGIN, _sq_norm
from dpfl.dpsgd.ghost import _unsupported
from dpfl.models.flat import FlatParams
from dpfl.models.loss import loss_per_sample

_PARAMETRIC = (nn.Conv2d, nn.Linear)


def _traceable(model: nn.Module) -> fx.GraphModule | None:
    try:
        gm = fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - fx raises many kinds; untraceable models use the vmap path
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
    _pool_before_relu(gm)
    return gm


def _pool_before_relu(gm: fx.GraphModule) -> None:
    """Rewrite ReLU → MaxPool2d as MaxPool2d → ReLU: the same values and the same gradients
    (ReLU is monotone, ReLU'(x ≤ 0) = 0 either way), with ReLU and its backward on a 4× smaller
    tensor."""
    mods = dict(gm.named_modules())

    def is_relu(n: fx.Node) -> bool:
        if n.op == "call_module":
            return isinstance(mods[n.target], nn.ReLU)
        return n.op == "call_function" and n.target in (F.relu, torch.relu) and len(n.args) == 1

    def is_pool(n: fx.Node) -> bool:
        return (n.op == "call_module" and isinstance(mods[n.target], nn.MaxPool2d)
                and not mods[n.target].return_indices and len(n.args) == 1)

    changed = False
    for relu in list(gm.graph.nodes):
        if not is_relu(relu) or len(relu.users) != 1:
            continue
        pool = next(iter(relu.users))
        if not is_pool(pool) or pool.args[0] is not relu:
            continue
        src = relu.args[0]
        pool.replace_all_uses_with(relu)
        pool.args = (src,)
        relu.args = (pool,)
        pool.append(relu)  # relu now runs after the pool
        changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


class LowRank:
    """A cohort's Linear weight kept as W_0 − lr·Σ_j G_jᵀ X_j (see the module docstring)."""

    def __init__(self, w0: torch.Tensor, lr: float):
        self.w0, self.lr = w0, lr
        self.xs: list[torch.Tensor] = []  # [k, B, in] per step
        self.gs: list[torch.Tensor] = []  # [k, B, out] per step
        self.out: torch.Tensor | None = None  # this step's output (its gradient becomes G)

    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        lead, d_in = x.shape[:-1], x.shape[-1]
        xb = x.reshape(k, -1, d_in)
        out = (xb.reshape(-1, d_in) @ self.w0.t()).view(k, xb.shape[1], -1)
        if self.xs:
            xh, gh = torch.cat(self.xs, 1), torch.cat(self.gs, 1)
            out = out - self.lr * torch.bmm(torch.bmm(xb, xh.transpose(1, 2)), gh)
        if not out.requires_grad:
            out.requires_grad_(True)
        self.out = out
        self.xs.append(xb.detach())
        return out.reshape(*lead, out.shape[-1])

    def record(self, g_out: torch.Tensor) -> None:
        self.gs.append(g_out.detach())
        self.out = None

    def delta(self, out: torch.Tensor) -> torch.Tensor:
        """−lr·Σ_j G_jᵀ X_j, [k, out, in], written into `out`."""
        if not self.gs:
            return out.zero_()
        xh, gh = torch.cat(self.xs, 1), torch.cat(self.gs, 1)
        return torch.baddbmm(out, gh.transpose(1, 2), xh, beta=0, alpha=-self.lr, out=out)


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

    def lowrank_candidates(self, rows: int) -> list[str]:
        """Linear weights whose step history (rows = steps·batch per client) is smaller than the
        weight itself: the low-rank form is cheaper for them."""
        if self.mode != "fx":
            return []
        out = []
        for name, m in self.gm.named_modules():
            if isinstance(m, nn.Linear) and rows * (m.in_features + m.out_features) < m.in_features * m.out_features:
                out.append(name + ".weight")
        return out

    def grads(self, params: dict[str, object], x: torch.Tensor, y: torch.Tensor,
              sign: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """fx path: gradients for the tensor entries of `params` ({name: [k, *shape] or LowRank});
        each LowRank records its G for this step."""
        leaves = {n: v.detach().requires_grad_(True) for n, v in params.items() if not isinstance(v, LowRank)}
        low = [v for v in params.values() if isinstance(v, LowRank)]
        k, b = x.shape[:2]
        views = {n: leaves.get(n, v) for n, v in params.items()}
        out = self._forward_fx(views, x.reshape(k * b, *x.shape[2:]), k)
        losses = loss_per_sample(out, y, self.task).view(k, b).mean(1)
        total = (losses * sign).sum() if sign is not None else losses.sum()
        gs = torch.autograd.grad(total, [*leaves.values(), *(lr.out for lr in low)])
        for lr, g in zip(low, gs[len(leaves):]):
            lr.record(g)
        return dict(zip(leaves, gs[: len(leaves)]))

    def bookkeeping_rows(self, batch: int) -> int:
        """Clients per `clipped_sums` call so that at most 2²⁸ per-example conv weight gradient
        values are held at once (1 GiB float32); 0 if the model cannot use book-keeping."""
        if self.mode != "fx" or _unsupported(self.model) is not None:
            return 0
        conv = sum(m.weight.numel() for m in self.model.modules() if isinstance(m, nn.Conv2d))
        return max(1, _BOOKKEEPING_VALUES // max(1, batch * conv))

    def clipped_sums(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, clip: float,
                     weight: torch.Tensor, out: dict[str, torch.Tensor] | None = None
                     ) -> dict[str, torch.Tensor] | None:
        """Σ_i m_i ḡ_i for every client at once, {name: [k, *shape]}: each (client, example)
        gradient clipped to `clip` as `dpfl.dpsgd.core.clipped_grad_sum` does (norm over all
        layers, float64 norms, the 1 − 2⁻¹² margin), weighted by `weight` [k, B] (0 = padding).
        Book-keeping (`dpfl.dpsgd.ghost`) over the whole cohort: one forward, one backward; Linear
        norms from ‖a_i‖²‖g_i‖², conv per-example weight gradients one layer at a time as a grouped
        convolution with one group per (client, example). None where this model or call cannot
        (the caller then uses the per-example vmap path). `out`: contiguous tensors like `params`
        to write the sums into (no fresh allocation of k model-sized tensors per step)."""
        if not self.bookkeeping_rows(x.shape[1]):
            return None
        k, b = x.shape[:2]
        seen: list = []
        with torch.enable_grad():
            leaves = {n: v.detach().requires_grad_(True) for n, v in params.items()}
            logits = self._forward_fx(leaves, x.reshape(k * b, *x.shape[2:]), k, seen)
            total = loss_per_sample(logits, y, self.task).sum()
        versions = [(a._version, o._version) for _, _, a, o in seen]
        names = [s[0] for s in seen]
        if len(set(names)) != len(names) or any(  # a module run twice, or a 3-D Linear input
                isinstance(m, nn.Linear) and a.dim() != 2 for _, m, a, _ in seen):
            return None
        grads = torch.autograd.grad(total, [s[3] for s in seen], allow_unused=True)
        if [(a._version, o._version) for _, _, a, o in seen] != versions:
            return None  # a recorded tensor was changed in place
        layers, sq = [], torch.zeros(k, b, dtype=torch.float64, device=x.device)
        for (name, m, a, o), g in zip(seen, grads):
            g = torch.zeros_like(o) if g is None else g
            s, wfn, bfn = _cohort_layer(m, a.detach(), g.detach(), k, b)
            sq += s
            layers.append((name, wfn, bfn))
        w = torch.clamp(clip * _CLIP_MARGIN / sq.sqrt(), max=1.0) * weight.to(sq)  # norm 0 -> inf -> 1
        res = {}
        for name, wfn, bfn in layers:
            wt = w.to(params[name + ".weight"].dtype)
            for key, fn in ((name + ".weight", wfn), (name + ".bias", bfn)):
                if fn is not None:
                    res[key] = fn(wt, None if out is None else out[key]).view(params[key].shape)
        if out is None:
            return {n: res[n] if n in res else torch.zeros_like(v) for n, v in params.items()}
        for n, v in out.items():
            if n not in res:  # parameters of layers the forward never used
                v.zero_()
        return out

    # ---- fx fast path -------------------------------------------------------------
    def _forward_fx(self, views: dict[str, object], x: torch.Tensor, k: int,
                    record: list | None = None) -> torch.Tensor:
        # Values between convolutions stay in the grouped layout [B, k·C, H, W] (clients in the
        # channel axis) as long as only per-channel ops (ReLU, pooling, dropout) touch them.
        # `record` gets (name, module, input, output) of every Conv2d (grouped layout) and dense
        # Linear (rows ordered client-major) call, for `clipped_sums`.
        env: dict[fx.Node, object] = {}
        grouped: set[fx.Node] = set()

        def plain(n: fx.Node):
            return _ungroup(env[n], k) if n in grouped else env[n]

        def load(a):
            return fx.graph.map_arg(a, plain)

        out = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = x
            elif node.op == "call_module":
                mod = self._mods[node.target]
                src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
                if isinstance(mod, nn.Conv2d):
                    xin = env[src] if src in grouped else _group(env[src], k)
                    env[node] = _conv(mod, views[node.target + ".weight"], views.get(node.target + ".bias"), xin, k)
                    grouped.add(node)
                    if record is not None:
                        record.append((node.target, mod, xin, env[node]))
                elif src in grouped and isinstance(mod, _PER_CHANNEL) and len(node.args) == 1 and not node.kwargs:
                    env[node] = mod(env[src])
                    grouped.add(node)
                elif isinstance(mod, nn.Linear) and isinstance(views[node.target + ".weight"], LowRank):
                    (arg,) = load(node.args)
                    out = views[node.target + ".weight"].forward(arg, k)
                    b = views.get(node.target + ".bias")
                    env[node] = out if b is None else out + b.repeat_interleave(out.shape[0] // k, 0)
                elif isinstance(mod, nn.Linear):
                    (arg,) = load(node.args)
                    lin = _linear if record is None else _linear_rows
                    env[node] = lin(views[node.target + ".weight"], views.get(node.target + ".bias"), arg, k)
                    if record is not None:
                        record.append((node.target, mod, arg, env[node]))
                else:
                    env[node] = mod(*load(node.args), **load(node.kwargs))
            elif node.op == "call_function":
                src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
                if src in grouped and node.target in _PER_CHANNEL_FN and len(node.args) == 1:
                    env[node] = node.target(env[src], **load(node.kwargs))
                    grouped.add(node)
                else:
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


_BOOKKEEPING_VALUES = 2**28


def _linear_rows(w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, k: int) -> torch.Tensor:
    """`_linear` as x Wᵀ: its input gradient g W reads W in its own layout (6× faster on CPU than
    `_linear`'s Wᵀ gᵀ at k = 30 on the thesis CNN); for `clipped_sums`, which never asks for dL/dW."""
    lead = x.shape[:-1]
    out = torch.bmm(x.reshape(k, -1, x.shape[-1]), w.transpose(1, 2))
    if b is not None:
        out = out + b.unsqueeze(1)
    return out.reshape(*lead, w.shape[1])


def _cohort_layer(m: nn.Module, a: torch.Tensor, g: torch.Tensor, k: int, b: int):
    """(squared per-example gradient norms float64 [k, B], (w [k, B], out) -> Σ_i w_i ∇W ℓ_i
    [k, *shape] written into `out` if given, the same for the bias or None) of one layer, from
    its input `a` and output gradient `g`."""
    if isinstance(m, nn.Conv2d):  # grouped layout [B, k·C, H, W] -> one group per (client, example)
        def by_client(v):
            return v.reshape(b, k, -1, *v.shape[2:]).transpose(0, 1).reshape(1, -1, *v.shape[2:])

        c_out = m.out_channels
        per = torch.nn.grad.conv2d_weight(
            by_client(a), (k * b * c_out, m.in_channels, *m.kernel_size), by_client(g), stride=m.stride,
            padding=m.padding, dilation=m.dilation, groups=k * b).view(k, b, -1)
        sq = _sq_norm(per.view(k * b, -1)).view(k, b)
        gb = g.reshape(b, k, c_out, -1).sum(-1).transpose(0, 1)  # per-example bias gradients [k, B, out]

        def weight(w, out):
            res = torch.bmm(w[:, None, :], per, out=None if out is None else out.view(k, 1, -1))
            return res.view(k, *m.weight.shape)
    else:  # Linear on [k·B, in], rows client-major: ‖∇W ℓ_i‖² = ‖a_i‖²‖g_i‖², never formed
        sq = (_sq_norm(a) * _sq_norm(g)).view(k, b)
        a, gb = a.reshape(k, b, -1), g.reshape(k, b, -1)

        def weight(w, out):
            return torch.bmm((gb * w[..., None]).transpose(1, 2), a, out=out)
    if m.bias is None:
        return sq, weight, None
    sq = sq + _sq_norm(gb.reshape(k * b, -1)).view(k, b)
    return sq, weight, lambda w, out: torch.bmm(w[:, None, :], gb, out=None if out is None else out[:, None])


_PER_CHANNEL = (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.Dropout, nn.Identity)
_PER_CHANNEL_FN = (F.relu, torch.relu, F.max_pool2d, F.avg_pool2d, F.dropout)


def _group(x: torch.Tensor, k: int) -> torch.Tensor:
    """[k·B, C, H, W] → [B, k·C, H, W]."""
    kb, c, h, w = x.shape
    xg = x.view(k, kb // k, c, h, w).transpose(0, 1).reshape(kb // k, k * c, h, w)
    return xg.contiguous(memory_format=torch.channels_last)


def _ungroup(x: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k·C, H, W] → [k·B, C, H, W]."""
    b, kc, h, w = x.shape
    return x.reshape(b, k, kc // k, h, w).transpose(0, 1).reshape(k * b, kc // k, h, w)


def _conv(mod: nn.Conv2d, w: torch.Tensor, b: torch.Tensor | None, xg: torch.Tensor, k: int) -> torch.Tensor:
    """Grouped layout in and out: [B, k·C_in, H, W] → [B, k·C_out, H', W'], one group per client."""
    wg = w.reshape(k * w.shape[1], *w.shape[2:]).contiguous(memory_format=torch.channels_last)
    return F.conv2d(xg, wg, None if b is None else b.reshape(-1), mod.stride, mod.padding, mod.dilation,
                    groups=k * mod.groups)


def _linear(w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, k: int) -> torch.Tensor:
    # out^T = W x^T keeps dL/dW = dOut^T x contiguous in W's own layout (no transposed copy of a big grad)
    lead = x.shape[:-1]
    xb = x.reshape(k, -1, x.shape[-1])
    out = torch.bmm(w, xb.transpose(1, 2)).transpose(1, 2)
    if b is not None:
        out = out + b.unsqueeze(1)
    return out.reshape(*lead, w.shape[1])
