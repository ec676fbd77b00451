"""The vectorized cohort trainer against independent per-client PyTorch loops."""

import copy

import pytest
import torch
import torch.nn.functional as F

from dpfl.models import build_model
from dpfl.training.cohort import CohortModel
from dpfl.training.trainer import LocalTraining, Trainer


def reference_updates(model, w, x, y, batches, lr, optimizer="sgd", mask=None, sign=None, loss="ce"):
    """Plain PyTorch: one nn.Module and one torch.optim optimizer per client."""
    from dpfl.models.flat import FlatParams

    flat = FlatParams(model)
    out = []
    for c in range(batches.shape[0]):
        m = copy.deepcopy(model)
        flat.load_into(m, w)
        opt = torch.optim.SGD(m.parameters(), lr=lr) if optimizer == "sgd" else KerasAdam(m.parameters(), lr)
        for t in range(batches.shape[1]):
            opt.zero_grad()
            b = batches[c, t]
            out_ = m(x[b])
            lo = (F.cross_entropy(out_, y[b]) if loss == "ce"
                  else F.binary_cross_entropy_with_logits(out_, y[b].float()))
            if sign is not None:
                lo = lo * sign[c]
            lo.backward()
            if mask is not None:
                for p, mv in zip(m.parameters(), flat.views(mask).values()):
                    p.grad.mul_(mv.to(p.dtype))
            opt.step()
        out.append(flat.flatten(m) - w)
    return torch.stack(out)


class KerasAdam:
    """Keras 2.2 Adam, written out: lr_t = lr·√(1−β2^t)/(1−β1^t); p −= lr_t·m/(√v + ε)."""

    def __init__(self, params, lr, b1=0.9, b2=0.999, eps=1e-7):
        self.params, self.lr, self.b1, self.b2, self.eps, self.t = list(params), lr, b1, b2, eps, 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        lr_t = self.lr * (1 - self.b2**self.t) ** 0.5 / (1 - self.b1**self.t)
        for p, m, v in zip(self.params, self.m, self.v):
            m.copy_(self.b1 * m + (1 - self.b1) * p.grad)
            v.copy_(self.b2 * v + (1 - self.b2) * p.grad**2)
            p -= lr_t * m / (v.sqrt() + self.eps)


@pytest.mark.parametrize("name,opts,shape", [
    ("cnn", {}, (1, 28, 28)),
    ("mlp", {"in_features": 64, "hidden": (32, 16), "num_classes": 10}, (64,)),
])
def test_vectorized_equals_per_client_loop(name, opts, shape):
    # float64, so that the batched (grouped-conv / bmm) math and the per-client math agree to ~1e-12
    torch.manual_seed(0)
    model = build_model(name, seed=1, **opts).double()
    tr = Trainer(model, "multiclass", LocalTraining(steps=3, batch_size=4, lr=0.1))
    assert tr.cohort.mode == "fx"
    w = tr.flat.flatten(model)
    x = torch.rand(40, *shape, dtype=torch.float64)
    y = torch.randint(0, 10, (40,))
    batches = torch.randint(0, 40, (5, 3, 4))
    got = tr.train(w, x, y, batches)
    ref = reference_updates(model, w, x, y, batches, 0.1)
    assert got.shape == (5, tr.flat.n)
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-11)
    # the sequential path (one client at a time) agrees too
    torch.testing.assert_close(tr.train_sequential(w, x, y, batches), got, rtol=1e-9, atol=1e-11)


def test_vmap_fallback_matches_fx():
    torch.manual_seed(0)
    model = build_model("mlp", seed=1, in_features=20, hidden=16, num_classes=3)
    fx = CohortModel(model, "multiclass", mode="fx")
    vm = CohortModel(model, "multiclass", mode="vmap")
    p = fx.flat.flatten(model).expand(4, -1).clone() + 0.01 * torch.randn(4, fx.flat.n)
    x, y = torch.rand(4, 6, 20), torch.randint(0, 3, (4, 6))
    torch.testing.assert_close(fx.client_grads(p, x, y), vm.client_grads(p, x, y), rtol=1e-4, atol=1e-6)


def test_adam_mask_and_gradient_ascent_match_reference():
    torch.manual_seed(0)
    model = build_model("mlp", seed=2, in_features=12, hidden=8, num_classes=4)
    tr = Trainer(model, "multiclass", LocalTraining(steps=3, batch_size=5, lr=0.01, optimizer="adam"))
    w = tr.flat.flatten(model)
    x, y = torch.rand(30, 12), torch.randint(0, 4, (30,))
    batches = torch.randint(0, 30, (3, 3, 5))
    mask = torch.rand(tr.flat.n) < 0.3
    sign = torch.tensor([1.0, -1.0, 1.0])
    got = tr.train(w, x, y, batches, mask=mask, sign=sign)
    ref = reference_updates(model, w, x, y, batches, 0.01, "adam", mask=mask, sign=sign)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)
    assert torch.all(got[:, ~mask] == 0)  # Top-K reset rule: untouched coordinates stay exactly at w


def test_binary_task_matches_reference():
    torch.manual_seed(0)
    model = build_model("mlp", seed=2, in_features=10, hidden=8, num_classes=1)
    tr = Trainer(model, "binary", LocalTraining(steps=2, batch_size=6, lr=0.1))
    w = tr.flat.flatten(model)
    x, y = torch.rand(30, 10), torch.randint(0, 2, (30,))
    batches = torch.randint(0, 30, (4, 2, 6))
    torch.testing.assert_close(tr.train(w, x, y, batches),
                               reference_updates(model, w, x, y, batches, 0.1, loss="bce"), rtol=1e-4, atol=1e-6)


def test_chunked_cohort_equals_whole():
    model = build_model("mlp", seed=2, in_features=12, hidden=8, num_classes=4)
    x, y = torch.rand(30, 12), torch.randint(0, 4, (30,))
    batches = torch.randint(0, 30, (7, 2, 5))
    whole = Trainer(model, "multiclass", LocalTraining(steps=2, batch_size=5, lr=0.1))
    parts = Trainer(model, "multiclass", LocalTraining(steps=2, batch_size=5, lr=0.1), max_cohort=3)
    w = whole.flat.flatten(model)
    torch.testing.assert_close(whole.train(w, x, y, batches), parts.train(w, x, y, batches))


def test_pool_before_relu_rewrite_is_exact_in_values_and_gradients():
    """The fx graph runs MaxPool2d before ReLU (4× less ReLU work); outputs and every client's
    gradient must equal the plain ReLU → pool module bit for bit, ties and negatives included."""
    from dpfl.training.cohort import _traceable

    model = build_model("cnn", seed=0)
    gm = _traceable(model)
    order = [type(dict(gm.named_modules())[n.target]).__name__ for n in gm.graph.nodes if n.op == "call_module"]
    assert order[:6] == ["Conv2d", "MaxPool2d", "ReLU", "Conv2d", "MaxPool2d", "ReLU"]
    g = torch.Generator().manual_seed(1)
    x = torch.rand(6, 1, 28, 28, generator=g)
    x[:, :, :8] = 0.0  # flat regions: ties inside pooling windows, and pre-activations ≤ 0
    y = torch.randint(0, 10, (6,), generator=g)
    ref = F.cross_entropy(model(x), y)
    ref_g = torch.autograd.grad(ref, list(model.parameters()))
    gm2 = _traceable(copy.deepcopy(model))
    out = F.cross_entropy(gm2(x), y)
    out_g = torch.autograd.grad(out, list(gm2.parameters()))
    assert torch.equal(out, ref)
    for a, b in zip(out_g, ref_g):
        assert torch.equal(a, b)
