"""Thesis models: exact parameter counts, shapes, Keras initialisation, LSTM equivalence, vmap."""

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl.errors import ConfigError
from dpfl.models import THESIS_PARAMS, build_model, count_params, list_models
from dpfl.models.text import KerasLSTM

G = torch.Generator().manual_seed(0)


def conv(i, o, k):  # Keras Conv2D / Dense parameter counts, from the layer definitions
    return k * k * i * o + o


EXPECTED = {  # the thesis's printed counts (§3), and the layer-by-layer sums that give them
    "cnn": (1_663_370, conv(1, 32, 5) + conv(32, 64, 5) + conv(7 * 7 * 64, 512, 1) + conv(512, 10, 1)),
    "medical-mlp": (1_496_601, conv(7280, 200, 1) + conv(200, 200, 1) + conv(200, 1, 1)),
    "allcnn-c": (
        1_369_738,
        conv(3, 96, 3)
        + 2 * conv(96, 96, 3)
        + conv(96, 192, 3)
        + 3 * conv(192, 192, 3)
        + conv(192, 192, 1)
        + conv(192, 10, 1),
    ),
    "imdb-cnn-lstm": (402_701, 5000 * 50 + 5 * 50 * 250 + 250 + 4 * (70 * (250 + 70) + 70) + 71),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_thesis_parameter_counts(name):
    printed, layer_sum = EXPECTED[name]
    assert printed == layer_sum == THESIS_PARAMS[name]
    assert count_params(build_model(name, seed=0)) == printed


@pytest.mark.parametrize(
    "name,x,out",
    [
        ("cnn", torch.rand(3, 1, 28, 28, generator=G), (3, 10)),
        ("medical-mlp", torch.rand(3, 7280, generator=G), (3,)),
        ("allcnn-c", torch.rand(3, 3, 32, 32, generator=G), (3, 10)),
        ("imdb-cnn-lstm", torch.randint(0, 5000, (3, 400), generator=G), (3,)),
    ],
)
def test_output_shapes_and_no_buffers(name, x, out):
    m = build_model(name, seed=0).eval()
    assert m(x).shape == out
    assert list(m.buffers()) == []
    assert not any(isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)) for mod in m.modules())


def test_small_models():
    m = build_model("mlp", in_features=64, hidden=[32, 16], num_classes=10, seed=0)
    assert count_params(m) == conv(64, 32, 1) + conv(32, 16, 1) + conv(16, 10, 1)
    assert m(torch.rand(4, 1, 8, 8, generator=G)).shape == (4, 10)
    lr = build_model("logreg", in_features=784, num_classes=1, seed=0)
    assert count_params(lr) == 785 and lr(torch.rand(4, 1, 28, 28, generator=G)).shape == (4,)
    assert set(list_models()) == {"cnn", "medical-mlp", "allcnn-c", "imdb-cnn-lstm", "mlp", "logreg"}


def test_keras_initialisation():
    m = build_model("medical-mlp", seed=1)
    w = m.net[1].weight.detach()  # Dense 7280 -> 200: glorot_uniform bound sqrt(6 / (fan_in + fan_out))
    bound = math.sqrt(6 / (7280 + 200))
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.99 * bound
    assert float(w.var()) == pytest.approx(bound**2 / 3, rel=0.01)  # uniform variance
    assert all(float(mod.bias.detach().abs().max()) == 0 for mod in m.modules() if isinstance(mod, nn.Linear))
    lstm = build_model("imdb-cnn-lstm", seed=1)
    b = lstm.lstm.bias.detach()
    assert torch.equal(b, torch.cat([torch.zeros(70), torch.ones(70), torch.zeros(140)]))  # unit_forget_bias
    whh = lstm.lstm.weight_hh.detach()  # orthogonal recurrent kernel: W^T W = I
    assert torch.allclose(whh.T @ whh, torch.eye(70), atol=1e-5)
    assert float(lstm.embedding.weight.detach().abs().max()) <= 0.05


def test_seeded_builds_are_identical():
    a, b, c = (build_model("cnn", seed=s) for s in (5, 5, 6))
    for (k, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), k
    assert not torch.equal(a.classifier[1].weight, c.classifier[1].weight)


def test_keras_lstm_matches_torch_lstm():
    # independent reference: nn.LSTM with b_ih = our bias and b_hh = 0 computes the same recurrence
    ours = KerasLSTM(6, 4)
    ref = nn.LSTM(6, 4, batch_first=True)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(generator=G)
        ref.weight_ih_l0.copy_(ours.weight_ih)
        ref.weight_hh_l0.copy_(ours.weight_hh)
        ref.bias_ih_l0.copy_(ours.bias)
        ref.bias_hh_l0.zero_()
    x = torch.randn(3, 9, 6, generator=G)
    _, (h, _) = ref(x)
    assert torch.allclose(ours(x), h[0], atol=1e-6)


def test_same_padding_sizes():
    cnn = build_model("cnn", seed=0)
    assert cnn.features(torch.zeros(1, 1, 28, 28)).shape == (1, 64, 7, 7)  # 28 -> 14 -> 7, flatten 3136
    net = build_model("allcnn-c", seed=0).net
    shapes = []
    x = torch.zeros(1, 3, 32, 32)
    for layer in net:
        x = layer(x)
        if isinstance(layer, nn.Conv2d):
            shapes.append(tuple(x.shape[-2:]))
    assert shapes == [(32, 32), (32, 32), (16, 16), (16, 16), (16, 16), (8, 8), (6, 6), (6, 6), (6, 6)]


@pytest.mark.parametrize(
    "name,kw,x",
    [
        ("cnn", {"image_size": 8}, torch.rand(3, 2, 1, 8, 8, generator=G)),
        ("allcnn-c", {}, torch.rand(3, 2, 3, 16, 16, generator=G)),
        (
            "imdb-cnn-lstm",
            {"vocab_size": 50, "filters": 8, "hidden": 5},
            torch.randint(0, 50, (3, 2, 20), generator=G),
        ),
        (
            "mlp",
            {"in_features": 20, "hidden": 8, "num_classes": 1, "dropout": 0.5},
            torch.rand(3, 2, 20, generator=G),
        ),
    ],
)
def test_vmap_functional_call_matches_loop(name, kw, x):
    m = build_model(name, seed=0, **kw).double()  # float64, so summation order cannot hide a mismatch
    x = x.double() if x.is_floating_point() else x
    k = x.shape[0]
    params = {
        n: p.detach() + 0.01 * torch.randn(k, *p.shape, generator=G, dtype=torch.float64)
        for n, p in m.named_parameters()
    }

    def loss(p, xb):
        return functional_call(m, p, (xb,)).square().sum()

    m.eval()
    g = vmap(grad(loss))(params, x)
    for i in range(k):
        gi = grad(loss)({n: v[i] for n, v in params.items()}, x[i])
        for n in gi:
            assert torch.allclose(g[n][i], gi[n], rtol=1e-9, atol=1e-12), n
    m.train()  # dropout under vmap needs per-client randomness
    out = vmap(lambda p, xb: functional_call(m, p, (xb,)), randomness="different")(params, x)
    assert out.shape[0] == k


def test_build_model_errors():
    with pytest.raises(ConfigError, match="unknown model 'resnet'; allowed: cnn, medical-mlp"):
        build_model("resnet")
    with pytest.raises(
        ConfigError, match=r"unknown options \['classes'\]; allowed: in_channels, num_classes"
    ):
        build_model("cnn", classes=10)
    with pytest.raises(ConfigError, match=r"needs options \['in_features'\]"):
        build_model("mlp")
    with pytest.raises(ConfigError, match="num_classes must be a positive integer, got 0"):
        build_model("logreg", in_features=4, num_classes=0)
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\)"):
        build_model("mlp", in_features=4, dropout=1.0)


def test_keras_order_is_the_keras_weight_layout_of_the_thesis_cnn():
    """keras_order(cnn) lists the flat vector as Keras 2.2 would concatenate get_weights(): conv
    kernels [kh, kw, in, out], the first Dense kernel over (H, W, C) features, Dense [in, out].
    Checked against the layout written out by hand, and by the function: the Keras-ordered
    Dense kernel applied to NHWC-flattened features gives the PyTorch layer's output."""
    from dpfl.models.flat import FlatParams
    from dpfl.models.keras_init import keras_order

    torch.manual_seed(0)
    model = build_model("cnn", seed=0)
    flat = FlatParams(model).flatten(model)
    perm = keras_order(model)
    assert torch.equal(torch.sort(perm).values, torch.arange(flat.numel()))
    conv1, conv2 = model.features[0], model.features[3]
    fc1, fc2 = model.classifier[1], model.classifier[3]
    by_hand = [conv1.weight.permute(2, 3, 1, 0), conv1.bias, conv2.weight.permute(2, 3, 1, 0), conv2.bias,
               fc1.weight.view(512, 64, 7, 7).permute(2, 3, 1, 0).reshape(3136, 512), fc1.bias,
               fc2.weight.t(), fc2.bias]
    keras = flat[perm]
    assert torch.equal(keras, torch.cat([w.detach().reshape(-1) for w in by_hand]))
    off = sum(w.numel() for w in by_hand[:4])
    kernel = keras[off : off + 3136 * 512].view(3136, 512)
    f = model.features(torch.randn(3, 1, 28, 28))
    torch.testing.assert_close(f.permute(0, 2, 3, 1).reshape(3, -1) @ kernel + fc1.bias, fc1(f.flatten(1)))


def test_keras_order_refuses_layers_it_does_not_know():
    from dpfl.models.keras_init import keras_order

    with pytest.raises(ConfigError, match="Conv2d and Linear"):
        keras_order(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
