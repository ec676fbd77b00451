"""Clipping, noise shares and their privacy events (dpfl.schemes.dp), against closed forms and scipy."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.errors import ConfigError
from dpfl.privacy import DiscreteGaussianEvent, GaussianEvent, SampledGaussianEvent, sampler_tv_bound
from dpfl.schemes.base import Received
from dpfl.schemes.dp import (
    ClipStep,
    DiscreteGaussianShareStep,
    DPMeanAggregator,
    GaussianNoiseStep,
    clip_rows,
    finite_rows,
)
from dpfl.secagg import RoundAborted


def _chi2_ok(x: np.ndarray, std: float, p: float = 1e-4) -> bool:
    """Two-sided χ² test that the entries of x are N(0, std²) in scale (mean known to be 0)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    t = float((x**2).sum() / std**2)
    return stats.chi2.ppf(p / 2, x.size) < t < stats.chi2.ppf(1 - p / 2, x.size)


def test_clip_bound_scaling_and_clipped_fraction(contexts):
    _, rctx = contexts(50)
    ctx = rctx(1, 6)
    u = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    u[0] *= 1e-3  # well inside the ball: untouched
    u[1] *= 1e6  # huge: scaled onto the sphere
    norms = u.double().norm(dim=1)
    S = float(norms.median())
    step = ClipStep(S)
    out = step.client(u, ctx)
    out_norms = out.double().norm(dim=1)
    assert torch.all(out_norms <= S)  # the bound holds in float64 after the float32 cast
    inside = norms <= S
    assert torch.equal(out[inside], u[inside])
    # clipped rows keep their direction and reach S up to float32 rounding
    cos = (out[~inside].double() * u[~inside].double()).sum(1) / (out_norms[~inside] * norms[~inside])
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-6)
    assert torch.allclose(out_norms[~inside], torch.full_like(out_norms[~inside], S), rtol=1e-5)
    assert ctx.metrics["dp_clip_fraction"] == pytest.approx(float((~inside).double().mean()))
    assert ctx.metrics["dp_clip_bound"] == S


def test_non_finite_rows_become_zero_and_are_counted(contexts):
    _, rctx = contexts(5)
    ctx = rctx(1, 3)
    u = torch.tensor([[1.0, 2, 3, 4, 5], [float("nan"), 0, 0, 0, 0], [0, float("inf"), 0, 0, 0]])
    out = ClipStep(1.0).client(u, ctx)
    assert torch.equal(out[1:], torch.zeros(2, 5))
    assert float(out[0].norm()) <= 1.0
    assert ctx.metrics["dp_nonfinite_rows"] == 2 and ctx.metrics["dp_clip_fraction"] == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_non_finite_rows_are_found_at_the_extremes(dtype):
    big = torch.finfo(dtype).max
    u = torch.zeros(6, 1000, dtype=dtype)
    u[0] = big  # finite, the largest value: clipped, not zeroed
    u[1, 5], u[2, 999], u[3, 0] = float("nan"), float("inf"), -float("inf")
    u[4, :3] = torch.tensor([big, -big, float("nan")], dtype=dtype)
    out, flagged = clip_rows(u, 1.0)
    assert torch.equal(out[1:5], torch.zeros(4, 1000, dtype=dtype))
    assert torch.isfinite(out).all() and float(out[0].double().norm()) <= 1.0 and flagged[:5].all()
    assert not flagged[5] and torch.equal(out[5], u[5])


def test_clip_rows_holds_the_bound_on_adversarial_rounding():
    torch.manual_seed(0)
    u = torch.randn(200, 333) * torch.logspace(-3, 3, 200)[:, None]
    for S in (1e-3, 0.1, 1.0, 7.77):
        out, _ = clip_rows(u, S)
        assert float(out.double().norm(dim=1).max()) <= S


def test_distributed_gaussian_shares_sum_to_std_s_sigma(contexts):
    k, d, S, sigma, l = 12, 4000, 0.7, 1.3, 3
    _, rctx = contexts(d)
    ctx = rctx(2, k)
    clip = ClipStep(S)
    step = GaussianNoiseStep(sigma, clip, q=0.05, tolerate=l)
    u = torch.zeros(k, d)
    noisy = step.client(clip.client(u, ctx), ctx)
    share = S * sigma / math.sqrt(k - l)
    assert step.share_std(k) == pytest.approx(share)
    for i in range(3):  # each share is N(0, (Sσ)²/(k − l))
        assert _chi2_ok(noisy[i].numpy(), share)
    # k − l of the shares (the survivors after l failures) carry exactly the target std Sσ
    assert _chi2_ok(noisy[: k - l].double().sum(0).numpy(), S * sigma)
    # same seed, same round → the same shares; another round → different
    again = step.client(clip.client(u, rctx(2, k)), rctx(2, k))
    assert torch.equal(again, noisy)
    assert not torch.equal(step.client(u, rctx(3, k)), noisy)
    assert step.privacy_events(ctx) == [SampledGaussianEvent(sigma, 0.05)]


def test_local_and_central_noise_scales(contexts):
    k, d, S, sigma = 5, 4000, 0.5, 2.0
    _, rctx = contexts(d)
    ctx = rctx(1, k)
    local = GaussianNoiseStep(sigma, ClipStep(S), q=0.1, noise="local")
    local.participation.setup(100)
    rows = local.client(torch.zeros(k, d), ctx)
    assert all(_chi2_ok(r.numpy(), S * sigma) for r in rows)
    central = GaussianNoiseStep(sigma, ClipStep(S), q=0.1, noise="central")
    assert torch.equal(central.client(torch.ones(k, d), ctx), torch.ones(k, d))  # clients add nothing
    ctx.cohort_size = 10
    agg = DPMeanAggregator()(Received(None, torch.zeros(d), k, np.zeros(k)), ctx)
    out = central.server(agg, ctx)
    assert _chi2_ok(out.numpy() * 10, S * sigma)  # noise on the sum is Sσ; the mean divides by |K|
    assert central.privacy_events(ctx) == [SampledGaussianEvent(sigma, 0.1)]


def test_local_noise_charges_the_worst_clients_participations(contexts):
    _, rctx = contexts(10)
    step = GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, noise="local")
    step.participation.setup(6)
    cohorts = [[0, 1], [2, 3], [0, 4], [5], [0, 1]]
    charged = []
    for r, c in enumerate(cohorts, 1):
        ctx = rctx(r, len(c))
        ctx.cohort = np.array(c)
        ev = step.privacy_events(ctx)
        charged.append(len(ev))
        if ev:
            assert ev == [GaussianEvent(0.5)]  # replace-one sensitivity 2S: multiplier σ/2, no sampling
        step.client(torch.zeros(len(c), 10), ctx)
    # brute force: the ledger grows exactly when some client's count exceeds the previous maximum
    counts, best, expect = np.zeros(6, int), 0, []
    for c in cohorts:
        counts[c] += 1
        expect.append(int(counts.max() > best))
        best = counts.max()
    assert charged == expect == [1, 0, 1, 0, 1]
    st = step.state_dict()
    other = GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, noise="local")
    other.load_state_dict(st)
    assert other.participation.max == 3 and other.participation.counts.tolist() == counts.tolist()


def test_discrete_gaussian_sign_shares(contexts):
    k, n, sigma, l = 8, 3000, 0.9, 2
    _, rctx = contexts(n)
    ctx = rctx(4, k)
    step = DiscreteGaussianShareStep(sigma, q=1 / 60, tolerate=l)
    mu = torch.where(torch.rand(k, n) < 0.5, 1, -1).to(torch.int8)
    z = step.client(mu, ctx)
    assert z.dtype == torch.int32
    xi = math.sqrt(n) * sigma / math.sqrt(k - l)
    assert step.share_std(n, k) == pytest.approx(xi)
    noise = (z - mu.to(torch.int64)).numpy()
    assert abs(noise.mean()) < 4 * xi / math.sqrt(noise.size)  # centred on sign(Δw)
    # the discrete Gaussian of std ξ ≈ 47 has variance ξ² to within 1e-300 (Poisson summation)
    assert _chi2_ok(noise[0], xi)
    assert _chi2_ok(noise[: k - l].sum(0), math.sqrt(n) * sigma)
    ev = step.privacy_events(ctx)
    assert ev == [DiscreteGaussianEvent(sigma, 1 / 60, n, k - l, sampler_tv=k * n * sampler_tv_bound(xi))]


def test_attack_rows_may_omit_their_noise_share(contexts):
    _, rctx = contexts(100)
    ctx = rctx(1, 4)
    ctx.omit_noise = np.array([False, True, False, True])
    step = GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1)
    u = torch.full((4, 100), 0.01)
    out = step.client(u, ctx)
    assert torch.equal(out[1], u[1]) and torch.equal(out[3], u[3])
    assert not torch.equal(out[0], u[0])
    assert ctx.metrics["dp_noise_shares"] == 2


def test_bad_parameters_are_refused(contexts):
    with pytest.raises(ConfigError, match="noise placement"):
        GaussianNoiseStep(1.0, ClipStep(1.0), 0.1, noise="trusted")
    with pytest.raises(ConfigError, match="tolerate"):
        GaussianNoiseStep(1.0, ClipStep(1.0), 0.1, tolerate=-1)
    with pytest.raises(ConfigError, match="only applies to distributed"):
        DiscreteGaussianShareStep(1.0, 0.1, tolerate=2, noise="local")
    with pytest.raises(ConfigError, match="σ"):
        GaussianNoiseStep(0.0, ClipStep(1.0), 0.1)
    with pytest.raises(ConfigError, match="clip bound"):
        ClipStep(-1.0)
    _, rctx = contexts(10)
    step = GaussianNoiseStep(1.0, ClipStep(1.0), 0.1, tolerate=3)
    with pytest.raises(RoundAborted, match="cannot tolerate"):
        step.client(torch.zeros(3, 10), rctx(1, 3))


def test_finite_rows_equal_isfinite_all_whatever_the_row_sums_do():
    """Rows whose sums overflow to ±inf or to NaN (+inf and −inf) are checked value by value."""
    big = torch.finfo(torch.float32).max
    u = torch.tensor([[big, big, 1.0], [big, -big, 0.0], [float("inf"), float("-inf"), 0.0],
                      [1.0, float("nan"), 2.0], [0.0, 0.0, float("-inf")], [-big, -big, -big], [1.0, 2.0, 3.0]])
    for x in (u, u.double(), u.half(), u.t().contiguous().t()):
        assert torch.equal(finite_rows(x), torch.isfinite(x).all(1))
    c = torch.tensor([[1 + 1j, 2j], [complex("nan"), 0j]])
    assert finite_rows(c).tolist() == [True, False]
    assert finite_rows(torch.ones(3, 4, dtype=torch.int64)).tolist() == [True] * 3
