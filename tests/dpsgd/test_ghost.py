"""Book-keeping clipped sums against explicit float64 per-example gradients (torch.func vmap(grad))."""

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl.dpsgd import dpsgd_step
from dpfl.dpsgd.core import clipped_grad_sum
from dpfl.dpsgd.ghost import bookkeeping_clipped_grad_sum, clipped_sum, path_for
from dpfl.models import build_model
from dpfl.pate.noise import gaussian
from dpfl.rng import Seeds

MARGIN = 1.0 - 2.0**-12


def per_example(model, params, x, y, loss="ce"):
    """vmap(grad) per-example gradients and their l2 norms."""

    def one(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        if loss == "ce":
            return nn.functional.cross_entropy(out, yi.unsqueeze(0))
        return nn.functional.binary_cross_entropy_with_logits(out.reshape(1), yi.reshape(1).double())

    g = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    return g, torch.sqrt(sum(v.reshape(len(x), -1).pow(2).sum(1) for v in g.values()))


def reference_sum(g, norms, clip, mask):
    """Σ m_i min(1, C'/‖g_i‖) g_i, all float64."""
    w = torch.clamp(clip * MARGIN / norms, max=1.0) * mask
    return {k: torch.einsum("b,b...->...", w, v) for k, v in g.items()}


CASES = [
    ("cnn", {}, (1, 28, 28), 10, "ce"),
    ("mlp", {"in_features": 20, "hidden": [16, 8]}, (20,), 10, "ce"),
    ("mlp", {"in_features": 20, "hidden": [16], "num_classes": 1}, (4, 5), 2, "bce"),
]


@pytest.mark.parametrize("name,opts,shape,classes,loss", CASES)
def test_bookkeeping_equals_explicit_per_example_gradients_in_float64(name, opts, shape, classes, loss):
    m = build_model(name, seed=0, **opts).double()
    p = {k: v.detach().clone() for k, v in m.named_parameters()}
    g = torch.Generator().manual_seed(1)
    x = torch.rand(5, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (5,), generator=g)
    mask = torch.tensor([1, 1, 0, 1, 1.0], dtype=torch.float64)
    g, norms = per_example(m, p, x, y, loss)
    clip = float(norms.median())  # some rows clipped, some not
    ref = reference_sum(g, norms, clip, mask)
    assert path_for(m) == "book-keeping"
    got = bookkeeping_clipped_grad_sum(p, {}, m, x, y, clip=clip, loss=loss, mask=mask)
    assert list(got) == list(ref)
    for k in ref:
        assert torch.allclose(got[k], ref[k], rtol=1e-10, atol=1e-13), k


def test_noised_update_is_the_reference_sum_plus_seeded_noise():
    m = build_model("mlp", seed=0, in_features=20, hidden=[16]).double()
    p = {k: v.detach().clone() for k, v in m.named_parameters()}
    x = torch.rand(8, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.arange(8) % 10
    clip, sigma, lr = 0.05, 1.3, 0.2
    new = dpsgd_step(p, {}, m, x, y, clip=clip, noise_multiplier=sigma, lr=lr, generator=Seeds(3).crypto("n"))
    ref = reference_sum(*per_example(m, p, x, y), clip, torch.ones(8, dtype=torch.float64))
    noise = torch.from_numpy(gaussian(Seeds(3).crypto("n"), sum(v.numel() for v in p.values()), sigma * clip))
    i = 0
    for k, v in p.items():
        z = noise[i : i + v.numel()].reshape(v.shape)
        i += v.numel()
        assert torch.allclose(new[k], v - lr * (ref[k] + z) / 8, rtol=1e-10, atol=1e-13), k


class Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.b(self.a(self.a(x)))


class Buffered(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 3)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.a(x) * self.scale


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.b(torch.relu_(self.a(x)))


@pytest.mark.parametrize(
    "model,why",
    [
        (lambda: nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 3)), "LayerNorm"),
        (lambda: Buffered(), "buffers"),
        (lambda: Twice(), None),
        (lambda: InPlace(), None),
    ],
)
def test_other_models_fall_back_to_the_per_example_path(model, why):
    torch.manual_seed(0)
    m = model().double()
    p = {k: v.detach().clone() for k, v in m.named_parameters()}
    x = torch.randn(6, 5, dtype=torch.float64)
    y = torch.arange(6) % 3
    if why:
        assert path_for(m).startswith("per-example") and why in path_for(m)
    else:  # found at call time: a module run twice, a recorded output changed in place
        assert path_for(m) == "book-keeping"
        assert bookkeeping_clipped_grad_sum(p, {}, m, x, y, clip=0.1) is None
    got = clipped_sum(p, {}, m, x, y, clip=0.1)
    ref = clipped_grad_sum(p, {}, m, x, y, clip=0.1)
    assert all(torch.allclose(got[k], ref[k], rtol=1e-12) for k in ref)


def test_uint64_words_are_the_keystream_bytes():
    import numpy as np

    a, b = Seeds(6).crypto("k"), Seeds(6).crypto("k")
    for n in (1, 7, 1000):
        assert np.array_equal(a.uint64(n), np.frombuffer(b.bytes(8 * n), dtype="<u8"))


def test_gaussian_into_refuses_bad_arguments():
    with pytest.raises(ValueError):
        Seeds(7).crypto("g").gaussian_into(torch.empty(4), -1.0)
    with pytest.raises(ValueError):
        Seeds(7).crypto("g").gaussian_into(torch.empty(4, 2).t(), 1.0)
