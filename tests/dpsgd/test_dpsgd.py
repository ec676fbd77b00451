"""DP-SGD core and trainer against independent references (autograd loops, the ledger, statistics)."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.func import functional_call, vmap
from typer.testing import CliRunner

from dpfl.cli.dpsgd import app
from dpfl.dpsgd import (
    DPPlan,
    clipped_grad_sum,
    dpsgd_step,
    make_private_with_epsilon,
    noisy_gradient,
    per_example_grads,
    train,
)
from dpfl.dpsgd.core import clip_factors
from dpfl.dpsgd.train import padded_chunks, poisson_sample
from dpfl.errors import DpflError
from dpfl.privacy.events import SampledGaussianEvent
from dpfl.privacy.ledger import Budget, Ledger
from dpfl.rng import Seeds


def tiny_cnn(binary=False):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3 * 4 * 4, 1 if binary else 4),
        *([nn.Flatten(0)] if binary else []),
    )


def params_of(m):
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def data(n=10, binary=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 2 if binary else 4, (n,), generator=g)
    return x, y


@pytest.mark.parametrize("binary", [False, True])
def test_per_example_grads_equal_a_loop_of_single_example_grads(binary):
    m = tiny_cnn(binary)
    x, y = data(binary=binary)
    g = per_example_grads(params_of(m), {}, m, x, y, loss="bce" if binary else "ce")
    for i in range(len(x)):
        m.zero_grad()
        out = m(x[i : i + 1])
        loss = (
            nn.functional.binary_cross_entropy_with_logits(out, y[i : i + 1].float())
            if binary
            else nn.functional.cross_entropy(out, y[i : i + 1])
        )
        loss.backward()
        for k, p in m.named_parameters():
            assert torch.allclose(g[k][i], p.grad, atol=1e-6, rtol=1e-5), k


def test_clipping_bounds_every_norm_and_keeps_small_gradients():
    m = tiny_cnn()
    x, y = data(30)
    p = params_of(m)
    g = per_example_grads(p, {}, m, x, y)
    norms = torch.sqrt(sum(v.reshape(30, -1).double().pow(2).sum(1) for v in g.values()))
    clip = float(norms.median())
    w = clip_factors(g, clip)
    clipped = torch.sqrt(
        sum((w[:, None].float() * v.reshape(30, -1)).double().pow(2).sum(1) for v in g.values())
    )
    assert torch.all(clipped <= clip)
    small = norms < clip * (1 - 2**-12)
    assert small.any() and (~small).any()
    assert torch.all(w[small] == 1.0)
    assert torch.allclose(clipped[~small], torch.full_like(clipped[~small], clip), rtol=3e-4)
    # the sum is Σ w_i g_i
    s = clipped_grad_sum(p, {}, m, x, y, clip=clip)
    for k in g:
        assert torch.allclose(s[k], (w.float().view(-1, *[1] * (g[k].ndim - 1)) * g[k]).sum(0), atol=1e-6)


def test_mask_drops_padding_rows():
    m = tiny_cnn()
    x, y = data(8)
    p = params_of(m)
    mask = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1.0])
    a = clipped_grad_sum(p, {}, m, x, y, clip=0.5, mask=mask)
    keep = mask.bool()
    b = clipped_grad_sum(p, {}, m, x[keep], y[keep], clip=0.5)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    chunks = list(padded_chunks(np.array([4, 9, 11, 20, 33]), 2))
    assert [c[0].tolist() for c in chunks] == [[4, 9], [11, 20], [33, 0]]
    assert chunks[-1][1].tolist() == [1.0, 0.0]


def test_noise_std_is_sigma_times_clip():
    sigma, clip, lot = 1.3, 0.7, 5.0
    zero = {"w": torch.zeros(400, 500)}
    g = (
        noisy_gradient(
            zero,
            clip=clip,
            noise_multiplier=sigma,
            expected_batch_size=lot,
            generator=Seeds(0).crypto("noise"),
        )["w"]
        .double()
        .ravel()
        * lot
    )
    n = g.numel()
    s2 = float(g.var())
    # chi-square 99.99% interval for the sample variance
    lo, hi = stats.chi2.ppf([5e-5, 1 - 5e-5], n - 1) / (n - 1) * (sigma * clip) ** 2
    assert lo < s2 < hi and abs(float(g.mean())) < 4 * sigma * clip / math.sqrt(n)
    assert stats.kstest(g[:20000].numpy(), stats.norm(scale=sigma * clip).cdf).pvalue > 1e-3


def test_dpsgd_step_without_noise_is_clipped_sgd():
    m = tiny_cnn()
    x, y = data(6)
    p = params_of(m)
    new = dpsgd_step(p, {}, m, x, y, clip=0.3, noise_multiplier=0.0, lr=0.1, generator=Seeds(0).crypto("n"))
    s = clipped_grad_sum(p, {}, m, x, y, clip=0.3)
    assert all(torch.allclose(new[k], p[k] - 0.1 * s[k] / 6) for k in p)
    with pytest.raises(DpflError, match="CryptoRNG"):
        dpsgd_step(p, {}, m, x, y, clip=0.3, noise_multiplier=1.0, lr=0.1, generator=torch.Generator())
    with pytest.raises(DpflError, match="clipping bound"):
        dpsgd_step(p, {}, m, x, y, clip=0.0, noise_multiplier=1.0, lr=0.1, generator=Seeds(0).crypto("n"))
    with pytest.raises(DpflError, match="loss"):
        clipped_grad_sum(p, {}, m, x, y, clip=1.0, loss="mse")


def test_vmap_over_clients_matches_a_loop():
    """The engine's use: vmap over a cohort of clients of the (already vmapped) clipped sum."""
    m = tiny_cnn()
    cohort = [params_of(tiny_cnn()) for _ in range(3)]
    for i, c in enumerate(cohort):
        for v in c.values():
            v.add_(0.1 * i)
    stacked = {k: torch.stack([c[k] for c in cohort]) for k in cohort[0]}
    xs = torch.stack([data(5, seed=i)[0] for i in range(3)])
    ys = torch.stack([data(5, seed=i)[1] for i in range(3)])
    masks = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 0, 1.0]])
    batched = vmap(lambda p, x, y, mk: clipped_grad_sum(p, {}, m, x, y, clip=0.5, mask=mk))(
        stacked, xs, ys, masks
    )
    for i in range(3):
        ref = clipped_grad_sum(cohort[i], {}, m, xs[i], ys[i], clip=0.5, mask=masks[i])
        assert all(torch.allclose(batched[k][i], ref[k], atol=1e-6) for k in ref)


def test_poisson_sampling_lot_sizes():
    rng = Seeds(1).crypto("sample")
    sizes = np.array([len(poisson_sample(rng, 2000, 0.05)) for _ in range(400)])
    assert abs(sizes.mean() - 100) < 4 * math.sqrt(2000 * 0.05 * 0.95 / 400)
    assert 0.7 < sizes.var() / (2000 * 0.05 * 0.95) < 1.4
    assert len(set(sizes.tolist())) > 10  # variable lot sizes


def _linear_problem(n=64):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 5, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    return nn.Linear(5, 2), x, y


def test_reported_epsilon_is_the_ledgers_and_runs_are_reproducible():
    m, x, y = _linear_problem()
    w0 = m.weight.detach().clone()
    plan = DPPlan(noise_multiplier=1.1, sample_rate=0.25, steps=12)
    r1 = train(m, x, y, plan=plan, clip=1.0, lr=0.5, seeds=Seeds(7), x_test=x, y_test=y, chunk_size=8)
    led = Ledger("rdp")
    led.add(SampledGaussianEvent(1.1, 0.25), count=12)
    assert r1.epsilon == pytest.approx(led.epsilon(1e-5), rel=1e-12)
    assert [h["step"] for h in r1.history] == [4, 8, 12]
    r2 = train(m, x, y, plan=plan, clip=1.0, lr=0.5, seeds=Seeds(7), chunk_size=8)
    r3 = train(m, x, y, plan=plan, clip=1.0, lr=0.5, seeds=Seeds(8), chunk_size=8)
    assert all(torch.equal(r1.params[k], r2.params[k]) for k in r1.params)
    assert not all(torch.equal(r1.params[k], r3.params[k]) for k in r1.params)
    assert torch.equal(m.weight, w0) and not torch.equal(r1.params["weight"], w0)  # model untouched
    # a budgeted ledger refuses the step that would exceed it
    tight = Ledger("rdp", budget=Budget(led.epsilon(1e-5) * 0.5, 1e-5))
    with pytest.raises(DpflError, match="budget"):
        train(m, x, y, plan=plan, clip=1.0, lr=0.5, seeds=Seeds(7), ledger=tight)


def test_make_private_with_epsilon_calibrates_sigma():
    plan = make_private_with_epsilon(2.0, 1e-5, 0.01, epochs=3)
    assert plan.steps == 300
    led = Ledger("rdp")
    led.add(SampledGaussianEvent(plan.noise_multiplier, 0.01), count=300)
    assert led.epsilon(1e-5) <= 2.0
    led2 = Ledger("rdp")
    led2.add(SampledGaussianEvent(plan.noise_multiplier * 0.99, 0.01), count=300)
    assert led2.epsilon(1e-5) > 2.0


def test_dpsgd_learns_a_separable_problem():
    m, x, y = _linear_problem(400)
    plan = DPPlan(noise_multiplier=0.8, sample_rate=0.2, steps=30)
    r = train(m, x, y, plan=plan, clip=1.0, lr=1.0, seeds=Seeds(0), x_test=x, y_test=y, chunk_size=128)
    assert r.test_accuracy > 0.9
    with torch.no_grad():
        base = (functional_call(m, dict(m.named_parameters()), (x,)).argmax(1) == y).float().mean()
    assert r.test_accuracy > float(base) + 0.2


def test_cli_train_digits():
    res = CliRunner().invoke(
        app,
        [
            "train",
            "--dataset",
            "digits",
            "--model",
            "logreg",
            "--model-options",
            '{"in_features": 64}',
            "--n-train",
            "300",
            "--n-test",
            "100",
            "--epochs",
            "1",
            "--lot-size",
            "60",
            "--noise-multiplier",
            "1.0",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["steps"] == 5 and out["n_train"] == 300 and 0 <= out["test_accuracy"] <= 1
    led = Ledger("rdp")
    led.add(SampledGaussianEvent(1.0, 60 / 300), count=5)
    assert out["epsilon"] == pytest.approx(led.epsilon(1e-5), rel=1e-12)
    bad = CliRunner().invoke(
        app,
        [
            "train",
            "--dataset",
            "digits",
            "--model",
            "logreg",
            "--model-options",
            '{"in_features": 64}',
            "--noise-multiplier",
            "1",
            "--target-epsilon",
            "1",
        ],
    )
    assert bad.exit_code == 2 and "exactly one" in bad.output


@pytest.mark.filterwarnings("ignore:Full backward hook")
def test_bench_measures_every_implementation_on_the_same_batch():
    from dpfl.bench.dpsgd import OPACUS_MODES, run_bench

    out = run_bench(
        model="mlp",
        model_options={"in_features": 784, "hidden": [16]},
        batch_sizes=(4, 8),
        steps=2,
        print_table=False,
    )
    assert out["params"] == 784 * 16 + 16 + 16 * 10 + 10 and out["path"] == "book-keeping"
    res = out["batches"][8]
    assert len(res["step_seconds"]["dpfl"]) == 2 and res["examples_per_s"]["dpfl"] > 0
    assert res["noise_draw_seconds"] > 0
    try:
        import opacus  # noqa: F401
    except ImportError:
        assert "not available" in out["opacus"] and list(res["examples_per_s"]) == ["dpfl"]
    else:
        rates = res["examples_per_s"]
        assert set(rates) == {"dpfl"} | {f"opacus-{m}" for m in OPACUS_MODES}
        best = max(v for k, v in rates.items() if k != "dpfl")
        assert res["speedup_vs_fastest_opacus"] == rates["dpfl"] / best
        assert rates[res["fastest_opacus"]] == best
