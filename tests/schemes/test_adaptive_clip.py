"""Adaptive clipping (Andrew et al., NeurIPS 2021): the geometric quantile update, the σ split the
ledger accounts, the count through the scheme's transport, checkpoints, and the options' errors."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm as normal

from dpfl.config import PrivacyConfig, load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError, ProtocolError
from dpfl.privacy import Ledger, SampledGaussianEvent, calibrate_sigma, epsilon_for
from dpfl.run.state import Run
from dpfl.schemes.dp import AdaptiveClipStep, GaussianNoiseStep, adaptive_update_sigma, joint_sigma
from dpfl.schemes.registry import build_scheme

TIMING = ("train_seconds", "eval_seconds", "round_seconds", "step_secagg_seconds", "step_dp_noise_seconds")


def _env(cohort=10, rounds=20):
    return {"n_params": 50, "cohort_size": cohort, "n_clients": 100, "sampling": "poisson", "sampling_rate": 0.1,
            "rounds": rounds, "privacy": PrivacyConfig(accountant="rdp", delta=1e-5), "seed": 0}


# ---------------------------------------------------------------- the quantile update on synthetic norms


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.8])
def test_the_geometric_update_tracks_the_target_quantile_of_the_norms(contexts, gamma):
    """Norms ~ log-normal(μ = 0, s = 0.5), fresh each round, k = 64 clients, count noise σ_b = 1: from
    C₀ = 0.1 (far below) the bound climbs to the γ-quantile and stays near it (the true unclipped
    fraction F(C_t) of rounds 81–120 within 0.04 of γ on average, 0.1 at worst)."""
    k, d, mu, s = 64, 3, 0.0, 0.5
    _, round_ctx = contexts(d)
    clip = AdaptiveClipStep(init=0.1, quantile=gamma, lr=0.2, count_sigma=1.0)
    noise = GaussianNoiseStep(0.5, clip, q=1.0, noise="central")  # the server adds the count's N(0, σ_b²)
    rng = np.random.default_rng(1)
    cdf = []
    for r in range(1, 121):
        ctx = round_ctx(r, k)
        ctx.cohort_size = k
        direction = torch.from_numpy(rng.normal(size=(k, d)))
        u = direction / direction.norm(dim=1, keepdim=True) * torch.from_numpy(rng.lognormal(mu, s, k))[:, None]
        rows = noise.client(clip.client(u.float(), ctx), ctx)
        assert rows.shape == (k, d + 1)
        agg = noise.server((rows.to(torch.float64).sum(0) / k).float(), ctx)
        before = clip.bound
        assert clip.server(agg, ctx).shape == (d,)
        b = ctx.metrics["dp_clip_noisy_unclipped"]
        assert clip.bound == pytest.approx(before * math.exp(-0.2 * (b - gamma)), rel=1e-12)  # C_{t+1}
        cdf.append(normal.cdf((math.log(clip.bound) - mu) / s))  # F(C_t): the true unclipped fraction
    assert cdf[0] < 0.01  # started far below the quantile
    assert abs(np.mean(cdf[80:]) - gamma) < 0.04 and max(abs(c - gamma) for c in cdf[80:]) < 0.1


def test_the_count_is_of_the_unclipped_norms_and_a_diverged_update_counts_as_above(contexts):
    _, round_ctx = contexts(2)
    clip = AdaptiveClipStep(init=1.0, quantile=0.5, lr=0.2, count_sigma=1.0)
    ctx = round_ctx(1, 4)
    u = torch.tensor([[0.3, 0.4], [3.0, 4.0], [float("nan"), 0.0], [0.0, 0.0]])
    out = clip.client(u, ctx)
    assert out[:, -1].tolist() == [0.5, -0.5, -0.5, 0.5]  # b − ½ with b = 1[‖u‖ ≤ C]
    assert torch.allclose(out[:, :2].norm(dim=1), torch.tensor([0.5, 1.0, 0.0, 0.0]))


# ---------------------------------------------------------------- the σ split and the ledger


@pytest.mark.parametrize("sigma,count_sigma", [(0.8, 1.0), (1.5406, 5.0), (0.5, 0.26)])
def test_the_sigma_split_is_the_closed_form_and_the_joint_gaussian_is_sigma(sigma, count_sigma):
    z_upd = adaptive_update_sigma(sigma, count_sigma)
    assert z_upd == pytest.approx((sigma ** -2 - (2 * count_sigma) ** -2) ** -0.5, rel=1e-15) and z_upd > sigma
    # the joint release: sum of updates (sensitivity S, noise z_Δ·S) and count of b − ½ (sensitivity ½, noise
    # σ_b): a Gaussian mechanism whose multiplier is 1/‖(S/(z_Δ S), ½/σ_b)‖ — the ledger's σ
    S = 0.37
    assert 1 / math.hypot(S / (z_upd * S), 0.5 / count_sigma) == pytest.approx(sigma, rel=1e-12)
    assert joint_sigma(z_upd, count_sigma) == pytest.approx(sigma, rel=1e-12)


def test_the_noise_step_adds_the_update_sigma_and_records_the_joint_event():
    scheme = build_scheme("fl-std-dp", {"sigma": 0.8, "clip": "adaptive", "clip_count_sigma": 1.0}, _env())
    clip, noise = scheme.steps
    assert isinstance(clip, AdaptiveClipStep) and noise.sigma == 0.8
    assert noise.update_sigma == pytest.approx(adaptive_update_sigma(0.8, 1.0))
    assert noise.share_std(10) == pytest.approx(0.1 * noise.update_sigma / math.sqrt(10))
    assert noise.count_share_std(10) == pytest.approx(1.0 / math.sqrt(10))
    assert noise.privacy_events(None) == [SampledGaussianEvent(0.8, 0.1)]
    assert "update σ_Δ=0.872872" in scheme.describe() and "count σ_b=1" in scheme.describe()


def test_a_target_epsilon_calibrates_the_joint_mechanism():
    scheme = build_scheme("fl-std-dp", {"epsilon": 2.0, "clip": "adaptive", "clip_count_sigma": 3.0}, _env())
    noise = scheme.steps[-1]
    joint = calibrate_sigma(2.0, 1e-5, 0.1, 20, "rdp")
    assert noise.sigma == joint and epsilon_for(joint, 0.1, 20, 1e-5) <= 2.0
    assert noise.update_sigma == pytest.approx(adaptive_update_sigma(joint, 3.0)) and noise.update_sigma > joint


def test_the_default_count_noise_is_a_twentieth_of_the_cohort_and_too_little_is_one_line():
    noise = build_scheme("fl-std-dp", {"sigma": 1.0, "clip": "adaptive"}, _env(cohort=100)).steps[-1]
    assert noise.count_sigma == 5.0
    with pytest.raises(ConfigError) as e:
        build_scheme("fl-std-dp", {"sigma": 1.0, "clip": "adaptive"}, _env(cohort=10))  # σ_b = 0.5 ≤ σ/2
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("scheme 'fl-std-dp': clip = 'adaptive'") and "must exceed σ/2" in msg


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("scheme,opts,words", [
    ("fl-std-dp", {"clip_quantile": 0.3}, "clip_quantile only applies to clip = 'adaptive' (got clip = 'auto')"),
    ("fl-std-dp", {"clip": 0.5, "clip_lr": 0.1, "clip_init": 1.0}, "clip_lr, clip_init only apply to clip = 'adaptive'"),
    ("fl-std-dp", {"clip": "adaptive", "clip_quantile": 1.5}, "clip_quantile must be a fraction in (0, 1]"),
    ("fl-std-dp", {"clip": "adaptive", "clip_quantile": 0}, "clip_quantile must be a fraction in (0, 1]"),
    ("fl-std-dp", {"clip": "adaptive", "clip_lr": -1.0}, "clip_lr must be a finite number > 0"),
    ("fl-std-dp", {"clip": "adaptive", "clip_count_sigma": math.inf}, "clip_count_sigma must be a finite number > 0"),
    ("fl-std-dp", {"clip": "median"}, "clip must be a number > 0, 'auto', 'private' or 'adaptive'"),
    ("fl-sign-dp", {"clip": "adaptive"}, ("option 'clip' does not apply: its discrete Gaussian mechanism on sign "
                                          "vectors has sensitivity √n")),
    ("fl-sign-dp", {"clip_quantile": 0.5}, "option 'clip_quantile' does not apply"),
    ("qsgd-dp", {"clip": "adaptive"}, "clip must be a number > 0 here (its compression runs after the noise)"),
])
def test_adaptive_options_are_refused_in_one_line_where_they_do_not_apply(scheme, opts, words):
    with pytest.raises(ConfigError) as e:
        build_scheme(scheme, {"sigma": 1.0, **opts}, _env())
    msg = str(e.value)
    assert words in msg and "\n" not in msg and msg.startswith(f"scheme {scheme!r}: ")


def test_another_aggregator_is_refused_because_the_count_is_read_from_the_dp_mean(tmp_path):
    data = _cfg_data(rounds=1, noise="central")
    data["scheme"]["aggregator"] = "weighted_mean"
    with pytest.raises(ConfigError, match="reads the 'dp_mean' aggregate, not 'weighted_mean'"):
        Run(load_config(data=data), None, log=lambda s: None).setup()


def test_a_deployed_client_takes_only_a_finite_positive_bound():
    clip = AdaptiveClipStep(init=0.1, count_sigma=1.0)
    clip.load_round_values({"bound": 0.25})
    assert clip.bound == 0.25 and clip.round_values() == {"bound": 0.25}
    for bad in (0.0, -1.0, math.nan, math.inf, True, None):
        with pytest.raises(ProtocolError, match="adaptive clip bound"):
            clip.load_round_values({"bound": bad})


# ---------------------------------------------------------------- end to end


def _cfg_data(rounds=6, **opts):
    return {
        "name": "adaptive", "seed": 5,
        "data": {"dataset": "digits", "n_clients": 30},
        "federation": {"rounds": rounds, "clients_per_round": 10},
        "train": {"steps": 2, "batch_size": 10, "lr": 0.1},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "scheme": {"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": "adaptive", "clip_count_sigma": 0.5,
                                                    "clip_init": 0.05, "clip_lr": 0.5, **opts}},
        "privacy": {"accountant": "rdp", "delta": 1e-5, "sampling_assumption": "poisson"},
        "eval": {"every": 1}, "run": {"checkpoint_every": 2, "threads": 1},
    }


def _metrics(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.parametrize("noise", ["distributed", "central"])
def test_fl_std_dp_adapts_its_clip_and_resumes_as_an_uninterrupted_run(tmp_path, noise):
    full, part = tmp_path / "full", tmp_path / "part"
    sim = Run(load_config(data=_cfg_data(noise=noise)), full, log=lambda s: None)
    simulate(sim)
    simulate(Run(load_config(data=_cfg_data(rounds=3, noise=noise)), part, log=lambda s: None))
    resumed = Run.resume(part, log=lambda s: None, rounds=6)
    simulate(resumed)
    a, b = _metrics(full), _metrics(part)
    assert len(a) == len(b) == 6 and a == b  # the clip state is checkpointed: resume = uninterrupted
    assert torch.equal(sim.w, resumed.w) and sim.scheme.steps[0].bound == resumed.scheme.steps[0].bound
    # one bound per round in the metrics, following the noisy count: C_{t+1} = C_t·exp(−η(b̄ − γ))
    for m, nxt in itertools.pairwise(a):
        assert nxt["step_dp_clip_bound"] == m["step_dp_clip_next"]
    for m in a:
        assert m["step_dp_clip_next"] == pytest.approx(
            m["step_dp_clip_bound"] * math.exp(-0.5 * (m["step_dp_clip_noisy_unclipped"] - 0.5)), rel=1e-12)
        unclipped = 1 - m["step_dp_clip_fraction"]  # the true fraction (a diagnostic, not released)
        if abs(unclipped - 0.5) >= 0.3:  # far from the median: the noisy count (std σ_b/|K| = 0.05) steers right
            assert (m["step_dp_clip_next"] > m["step_dp_clip_bound"]) == (unclipped < 0.5)
    # from C₀ = 0.05 every update is clipped; the bound climbs to the median norm
    assert a[0]["step_dp_clip_fraction"] == 1.0 and a[-1]["step_dp_clip_fraction"] <= 0.6
    assert a[-1]["step_dp_clip_next"] > 3 * a[0]["step_dp_clip_bound"]
    # the ledger accounts the joint release at σ (the update got σ_Δ > σ, the count σ_b)
    ref = Ledger("rdp")
    for m in a:
        ref.add(SampledGaussianEvent(0.8, 1 / 3))
        assert m["epsilon"] == pytest.approx(ref.epsilon(1e-5), rel=1e-12)
    if noise == "distributed":  # the count travels inside the secure sum: one more value per row
        assert sim.scheme.transport.secure and all(m["step_secagg_bits"] > 0 for m in a)
        assert all(m["step_dp_count_share_std"] == pytest.approx(0.5 / math.sqrt(10)) for m in a)
