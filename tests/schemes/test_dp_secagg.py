"""Distributed noise through secure aggregation: exact sums, dropouts after masking, aborts, and
FL-SIGN-DP's bits per parameter measured from the masked payloads."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.config import PrivacyConfig
from dpfl.schemes.catalog_dp import fl_sign_dp
from dpfl.schemes.dp import ClipStep, DiscreteGaussianShareStep, DPMeanAggregator, GaussianNoiseStep
from dpfl.schemes.secure_sum import SecureSum
from dpfl.secagg import RoundAborted, decode_fixed, encode_fixed
from dpfl.secagg.protocol import HEADER_BYTES, MaskedInput

N_B = 1_663_370  # thesis CNN, setting B


def _drops(ctx, k, frac):
    """The clients SecAggTransport drops after masking (documented: ⌊frac·k⌋ from ctx.numpy_rng("secagg-drop"))."""
    n = int(frac * k)
    return np.sort(ctx.numpy_rng("secagg-drop").choice(k, size=n, replace=False)) if n else np.array([], int)


def test_100_clients_30_percent_drop_after_masking_exact_survivor_sum_and_full_noise(contexts):
    k, d, S, sigma, l = 100, 600, 1.0, 1.5, 30
    _, rctx = contexts(d)
    ctx = rctx(1, k)
    ctx.cohort_size = k
    clip = ClipStep(S)
    noise = GaussianNoiseStep(sigma, clip, q=0.1, tolerate=l)
    transport = SecureSum(noise, drop_after_masking=0.3)
    u = torch.zeros(k, d)
    u[:, 0] = torch.linspace(-3, 3, k)  # some rows get clipped
    rows = noise.client(clip.client(u, ctx), ctx)
    inner = transport.round_transport(k, d)
    bits = inner.round_bits(k)
    rec = transport.transmit(rows.clone(), ctx)  # transmit encodes the float32 rows in their own memory
    dropped = _drops(ctx, k, 0.3)
    surv = np.setdiff1d(np.arange(k), dropped)
    assert rec.rows is None and rec.count == 70 == len(surv)
    assert (rec.upstream_bytes[dropped] == 0).all() and (rec.upstream_bytes[surv] > 0).all()
    # exact: the plain modular sum of the survivors' encoded rows (same rounding draws)
    words = encode_fixed(rows, bits, inner.clip_range, inner.frac_bits, ctx.numpy_rng("secagg-round"))
    plain = words[surv].astype(np.uint64).sum(0)
    assert np.array_equal(rec.total.numpy(), decode_fixed(plain, bits, inner.frac_bits))
    # and within the fixed-point rounding of the real sum
    assert float((rec.total - rows[surv].double().sum(0)).abs().max()) <= 70 * 2.0 ** -inner.frac_bits
    # 70 shares of std Sσ/√(100 − 30) carry the full noise std Sσ (χ² test on the noise part)
    z = (rec.total - clip.client(u, ctx)[surv].double().sum(0)).numpy()
    t = float((z**2).sum() / (S * sigma) ** 2)
    assert stats.chi2.ppf(1e-4, d) < t < stats.chi2.ppf(1 - 1e-4, d)
    mean = DPMeanAggregator()(rec, ctx)
    assert torch.allclose(mean.double(), rec.total / k, rtol=1e-6)
    assert ctx.metrics["up_bits_per_value"] == pytest.approx(8 * (HEADER_BYTES + 1 + math.ceil(d * bits / 8)) / d)


def test_more_failures_than_tolerated_abort_without_a_sum(contexts):
    k, d = 20, 50
    _, rctx = contexts(d)
    ctx = rctx(1, k)
    noise = GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, tolerate=3)
    transport = SecureSum(noise, drop_after_masking=0.2)  # 4 drop > l = 3
    rows = noise.client(torch.zeros(k, d), ctx)
    with pytest.raises(RoundAborted):
        transport.transmit(rows, ctx)
    ok = SecureSum(GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, tolerate=4), drop_after_masking=0.2)
    assert ok.transmit(rows, ctx).count == 16


def test_fl_sign_dp_secure_sum_equals_the_plain_sum_of_noisy_integers(contexts):
    k, n, sigma = 10, 5000, 1.2
    _, rctx = contexts(n)
    ctx = rctx(3, k)
    share = DiscreteGaussianShareStep(sigma, q=0.1, tolerate=2)
    transport = SecureSum(share, drop_after_masking=0.2)
    mu = torch.where(torch.rand(k, n) < 0.5, 1, -1).to(torch.int8)
    z = share.client(mu, ctx)
    rec = transport.transmit(z.clone(), ctx)  # the transport masks int32 rows in their own memory
    surv = np.setdiff1d(np.arange(k), _drops(ctx, k, 0.2))
    assert rec.total.dtype == torch.int64
    assert torch.equal(rec.total, z[surv].sum(0))
    b = math.ceil(math.log2((12 * math.sqrt(n) * sigma * math.sqrt(k / (k - 2)) + 1) * k))
    assert ctx.metrics["secagg_bits"] == b


@pytest.mark.parametrize("epsilon,bits", [(1, 22), (2, 21), (4, 21)])
def test_fl_sign_dp_bits_per_parameter_in_setting_b(contexts, epsilon, bits):
    privacy = PrivacyConfig(accountant="moments", delta=1e-5)
    scheme = fl_sign_dp(n_params=N_B, cohort_size=100, sampling_rate=1 / 60, rounds=200, privacy=privacy,
                        epsilon=epsilon)
    share = scheme.steps[1]
    assert share.sigma == pytest.approx({1: 1.5406, 2: 1.0844, 4: 0.8100}[epsilon], abs=2e-4)
    inner = scheme.transport.round_transport(100, N_B)
    assert inner.round_bits(100) == bits
    # measured on a real masked payload of one client at that modulus (2 clients keep the test fast;
    # the modulus is the one chosen for |K| = 100)
    _, rctx = contexts(N_B)
    ctx = rctx(1, 2)
    z = torch.from_numpy(np.random.default_rng(0).integers(-5000, 5000, size=(2, N_B)))
    rec = inner.transmit(z, ctx)
    assert torch.equal(rec.total, z.sum(0))
    wire = MaskedInput(0, 1, bits, np.zeros(N_B, dtype=np.uint32)).to_bytes()
    assert len(wire) == rec.upstream_bytes[0] == rec.upstream_bytes[1]
    per_param = 8 * len(wire) / N_B
    assert bits <= per_param < bits + 1e-3  # b bits per value plus a 13-byte header
