import math

import numpy as np
import pytest
import torch

from dpfl.compression.cs import bpdn
from dpfl.compression.dct import ChunkedDCT
from dpfl.errors import ConfigError
from dpfl.schemes.aggregators import MeanAggregator
from dpfl.schemes.cs import CompressiveSensingStep, LowPassDCTStep
from dpfl.schemes.transport import PlainTransport


def run_round(step, u, ctx):
    rec = PlainTransport().transmit(step.client(u, ctx), ctx)
    return rec, step.server(MeanAggregator()(rec, ctx), ctx)


def test_client_payload_is_m_float32_and_linear(contexts):
    n = 3000
    sctx, rctx = contexts(n)
    step = CompressiveSensingStep(ratio=0.05, chunks=6)
    step.setup(sctx)
    ctx = rctx(1, 4)
    u = torch.randn(4, n)
    y = step.client(u, ctx)
    assert y.shape == (4, 150)
    rec = PlainTransport().transmit(y, ctx)
    assert rec.upstream_bytes.tolist() == [4 * 150] * 4  # 4·m bytes, m = ⌊r·n⌋
    # linearity: the server's mean of compressed updates is the compression of the mean update
    torch.testing.assert_close(MeanAggregator()(rec, ctx), step.op.compress(u.mean(0)), atol=1e-6, rtol=0)
    # the permutation is derived from the shared seed: same seed, same operator
    other = CompressiveSensingStep(ratio=0.05, chunks=6)
    other.setup(contexts(n)[0])
    assert torch.equal(other.client(u, ctx), y)


def test_error_feedback_and_momentum_algebra(contexts):
    n, rho, eta = 2000, 0.9, 0.35
    sctx, rctx = contexts(n, seed=4)
    step = CompressiveSensingStep(ratio=0.1, chunks=4, server_lr=eta, momentum=rho)
    step.setup(sctx)
    op = ChunkedDCT(n, 200, 4, sctx.seeds.numpy("cs", "permutation").permutation(n))
    mom, err = torch.zeros(200), torch.zeros(200)
    gen = torch.Generator().manual_seed(0)
    for r in range(1, 4):
        u = torch.randn(5, n, generator=gen) * 1e-2
        rec, s = run_round(step, u, rctx(r, 5))
        y = rec.total.double() / 5
        mom = rho * mom + y.float()  # Alg. 4 lines 8–12, recomputed independently
        e = eta * mom + err
        s_ref, _ = bpdn(op, e, 1e-5, tol=step.tol, max_iter=step.max_iter)
        err = e - op.compress(s_ref)
        torch.testing.assert_close(s, s_ref, atol=1e-7, rtol=0)
        torch.testing.assert_close(step.u, mom, atol=1e-7, rtol=0)
        torch.testing.assert_close(step.e, err, atol=1e-7, rtol=0)
        # what was not reconstructed stays in the error: e_t + C(s_t) = η_G u_t + e_{t−1}
        torch.testing.assert_close(step.e + op.compress(s), e, atol=1e-6, rtol=0)


def test_sparse_mean_update_is_reconstructed(contexts):
    n = 8000
    sctx, rctx = contexts(n)
    step = CompressiveSensingStep(ratio=0.5, chunks=4, server_lr=1.0, momentum=0.0)
    step.setup(sctx)
    rng = np.random.default_rng(1)
    x = np.zeros(n, np.float32)
    x[rng.choice(n, 40, replace=False)] = rng.choice([-1, 1], 40) * (0.01 + 0.01 * rng.random(40))
    u = torch.from_numpy(x).expand(3, n).clone()
    _, s = run_round(step, u, rctx(1, 3))
    assert float((s - u[0]).norm() / u[0].norm()) < 0.05


def test_state_dict_resumes_bit_identically(contexts):
    n = 1500
    gen = torch.Generator().manual_seed(2)
    us = [torch.randn(3, n, generator=gen) * 1e-2 for _ in range(3)]
    sctx, rctx = contexts(n)
    a = CompressiveSensingStep(ratio=0.1, chunks=3)
    a.setup(sctx)
    for r in (1, 2):
        run_round(a, us[r - 1], rctx(r, 3))
    state = a.state_dict()
    b = CompressiveSensingStep(ratio=0.1, chunks=3)
    b.setup(contexts(n)[0])
    b.load_state_dict(state)
    _, sa = run_round(a, us[2], rctx(3, 3))
    _, sb = run_round(b, us[2], rctx(3, 3))
    assert torch.equal(sa, sb) and torch.equal(a.e, b.e) and torch.equal(a.u, b.u)


def test_fl_freq_is_a_low_pass_round_trip(contexts):
    n = 1000  # a fast FFT length: no padding
    sctx, rctx = contexts(n)
    step = LowPassDCTStep(ratio=0.1)
    step.setup(sctx)
    ctx = rctx(1, 2)
    u = torch.randn(2, n, dtype=torch.float64)
    y = step.client(u, ctx)
    assert y.shape == (2, 100)
    low = step.server(y.mean(0), ctx)
    # the result is the projection of the mean onto the first 100 DCT basis vectors
    again = step.server(step.client(low.unsqueeze(0), ctx)[0], ctx)
    torch.testing.assert_close(again, low, atol=1e-5, rtol=0)
    resid = u.mean(0).float() - low
    assert float(step.client(resid.unsqueeze(0), ctx).abs().max()) < 1e-5  # nothing low-frequency left


def test_fl_freq_keras_layout_low_passes_the_keras_ordered_vector(contexts):
    """layout = "keras": the kept coefficients are those of the update in Keras order, and the
    server's low-pass comes back in this library's order."""
    from dpfl.models import build_model
    from dpfl.models.keras_init import keras_order

    model = build_model("cnn", seed=0)
    n = sum(p.numel() for p in model.parameters())
    sctx, rctx = contexts(n, model=model)
    keras, plain = LowPassDCTStep(0.01, layout="keras"), LowPassDCTStep(0.01)
    keras.setup(sctx)
    plain.setup(sctx)
    perm = keras_order(model)
    u = torch.randn(1, n)
    assert torch.equal(keras.client(u, rctx(1, 1)), plain.client(u[:, perm], rctx(1, 1)))
    y = keras.client(u, rctx(1, 1))[0]
    back = torch.empty(n)
    back[perm] = plain.server(y, rctx(1, 1))
    assert torch.equal(keras.server(y, rctx(1, 1)), back)
    assert "keras layout" in keras.describe()
    with pytest.raises(ConfigError, match="layout"):
        LowPassDCTStep(0.1, layout="tf")
    with pytest.raises(ConfigError, match="needs the model"):
        LowPassDCTStep(0.1, layout="keras").setup(contexts(n)[0])


def _noised(ctx, tau):
    """The round's context as the DP noise step leaves it: noise std tau in the mean."""
    ctx.dp_noise_std = tau
    return ctx


def test_noise_lambda_is_the_universal_threshold_of_the_dp_noise(contexts):
    """λ = "noise": the first round of noise-only aggregates reconstructs to nothing (thesis
    λ = 1e-5 interpolates it), λ follows the noise variance through the momentum, and a sparse
    signal above the noise still comes through."""
    n, tau, rho = 20000, 0.01, 0.9
    sctx, rctx = contexts(n, seed=2)
    gen = torch.Generator().manual_seed(1)
    y = torch.randn(1000, generator=gen) * tau  # the DP mean of all-zero updates (m = 0.05 n)
    nnz = {}
    for lam in (1e-5, "noise"):
        step = CompressiveSensingStep(ratio=0.05, chunks=4, lam=lam, momentum=rho)
        step.setup(sctx)
        nnz[lam] = int((step.server(y, _noised(rctx(1, 5), tau)) != 0).sum())
    assert nnz["noise"] == 0 and nnz[1e-5] > 1000
    ctx = _noised(rctx(2, 5), tau)
    step.server(torch.zeros(1000), ctx)
    var = tau**2 * (1 + rho**2)
    assert step.state_dict()["noise_var"] == pytest.approx(var)
    assert ctx.metrics["cs_lambda"] == pytest.approx(0.35 * math.sqrt(var * 0.05 * 2 * math.log(n)), rel=1e-3)
    step = CompressiveSensingStep(ratio=0.05, chunks=4, lam="noise", momentum=0.0, server_lr=1.0,
                                  max_iter=5000, tol=1e-4)
    step.setup(sctx)
    w = torch.zeros(n)
    w[torch.randperm(n, generator=gen)[:20]] = 5.0
    s = step.server(step.op.compress(w.unsqueeze(0))[0] + y, _noised(rctx(1, 5), tau))
    assert len(set(s.abs().topk(20).indices.tolist()) & set(w.nonzero().flatten().tolist())) >= 18


def test_noise_lambda_needs_a_dp_scheme(contexts):
    sctx, rctx = contexts(3000)
    step = CompressiveSensingStep(ratio=0.05, chunks=3, lam="noise")
    step.setup(sctx)
    with pytest.raises(ConfigError, match="needs a DP scheme"):
        step.server(torch.zeros(step.op.m), rctx(1, 4))
    with pytest.raises(ConfigError, match="'noise'"):
        CompressiveSensingStep(ratio=0.05, lam="auto")


def test_lam_scale_multiplies_the_noise_threshold(contexts):
    n, tau = 20000, 0.01
    sctx, rctx = contexts(n, seed=2)
    lams = {}
    for scale in (1.0, 0.5):
        step = CompressiveSensingStep(ratio=0.05, chunks=4, lam="noise", lam_scale=scale)
        step.setup(sctx)
        ctx = _noised(rctx(1, 5), tau)
        step.server(torch.zeros(1000), ctx)
        lams[scale] = ctx.metrics["cs_lambda"]
    assert lams[0.5] == pytest.approx(lams[1.0] / 2, rel=1e-9)
    assert "0.5·noise" in step.describe()
    with pytest.raises(ConfigError, match="lam_scale"):
        CompressiveSensingStep(ratio=0.05, lam=1e-5, lam_scale=0.5)
    with pytest.raises(ConfigError, match="lam_scale"):
        CompressiveSensingStep(ratio=0.05, lam="noise", lam_scale=0)


def test_without_error_feedback_what_the_decoder_left_out_is_dropped(contexts):
    """error_feedback = False: e_t is zeroed after each round (the metric still reports what was
    left out), so a round's input is η_G u_t alone; with it on, e_t carries into the next round."""
    n, tau = 20000, 0.01
    sctx, rctx = contexts(n, seed=2)
    gen = torch.Generator().manual_seed(4)
    ys = [torch.randn(1000, generator=gen) * tau for _ in range(3)]
    norms, states = {}, {}
    for ef in (True, False):
        step = CompressiveSensingStep(ratio=0.05, chunks=4, lam="noise", error_feedback=ef)
        step.setup(sctx)
        norms[ef] = []
        for t, y in enumerate(ys, 1):
            ctx = _noised(rctx(t, 5), tau)
            step.server(y, ctx)
            norms[ef].append(ctx.metrics["cs_error_norm"])
        states[ef] = step.state_dict()
    assert norms[True][0] == norms[False][0] > 0  # round 1: nothing carried yet
    assert norms[True][2] > norms[False][2]
    assert float(states[False]["error"].abs().max()) == 0.0 and float(states[True]["error"].norm()) > 0
    assert torch.equal(states[True]["momentum"], states[False]["momentum"])
    assert "no error feedback" in step.describe()
    with pytest.raises(ConfigError, match="error_feedback"):
        CompressiveSensingStep(ratio=0.05, lam="noise", error_feedback="no")
