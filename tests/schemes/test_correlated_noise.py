"""Correlated noise in the DP schemes (dp.CorrelatedNoiseStep): the noise the step adds against the direct
computation, its ledger events, small federated runs on digits with each mechanism (ε reported, same seed →
bit-identical, resume = the uninterrupted run), the distributed variant, and the one-line ConfigErrors."""

import json
import math

import numpy as np
import pytest
import torch

from dpfl.config import PrivacyConfig, load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError, DataError
from dpfl.privacy import factorization as F
from dpfl.run.state import Run
from dpfl.schemes.dp import ClipStep, CorrelatedNoiseStep
from dpfl.schemes.registry import build_scheme
from dpfl.secagg import RoundAborted

TIMING = ("train_seconds", "eval_seconds", "round_seconds", "step_secagg_seconds", "step_dp_noise_seconds")


def _cfg(opts, rounds=6, fed=None, scheme="fl-std-dp", accountant="pld", **extra):
    federation = {"rounds": rounds, "clients_per_round": 6, **(fed or {})}
    return load_config(data={
        "name": "mf", "seed": 5,
        "data": {"dataset": "digits", "n_clients": 60},
        "federation": federation,
        "train": {"steps": 5, "batch_size": 10, "lr": 0.5},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "scheme": {"name": scheme, "options": opts},
        "privacy": {"accountant": accountant, "delta": 1e-5}, "eval": {"every": 1},
        "run": {"checkpoint_every": 2, "threads": 1}, **extra,
    })


def _metrics(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


CYCLIC = {"participation": "cyclic", "groups": 3}
MINSEP = {"participation": "min-separation", "separation": 3}


# ---------------------------------------------------------------- the step's noise and events


def _step(mf_name, T, noise="central", schema=("cyclic", 3), sigma=1.5, clip=0.5, **kw):
    f, s2, exact = F.build(mf_name, T, *schema, **kw)
    return CorrelatedNoiseStep(sigma, ClipStep(clip), f, s2, exact, schema, noise)


@pytest.mark.parametrize("mech,kw", [("tree", {"restart": 3}), ("bandmf", {})])
def test_the_central_noise_on_the_mean_has_covariance_S_sigma_over_K_squared_F_F_transpose(contexts, mech, kw):
    """The server adds S·σ·z̃_t/|K| to the mean: over 30,000 coordinates (independent sample paths), zero
    updates, the added noise's covariance is (Sσ/|K|)² F Fᵀ within 6 standard errors."""
    T, n, k = 6, 30_000, 4
    step = _step(mech, T, **kw)
    _, round_ctx = contexts(n)
    rows = []
    for r in range(1, T + 1):
        ctx = round_ctx(r, k)
        ctx.cohort_size = k
        assert step.privacy_events(ctx) is not None
        rows.append(step.server(torch.zeros(n), ctx).to(torch.float64).numpy())
        assert ctx.dp_noise_std == pytest.approx(0.5 * 1.5 * step.round_std[r - 1] / k)
    z = np.stack(rows) / (0.5 * 1.5 / k)
    want = step.mf.noise_map @ step.mf.noise_map.T
    se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want ** 2) / n)
    assert np.all(np.abs(z @ z.T / n - want) < 6 * se + 1e-6)  # (+ float32 rounding of the mean)


def test_the_events_compose_to_the_gaussian_of_each_rounds_sensitivity(contexts):
    step = _step("bandmf", 9)  # cyclic b = 3: Δ_r² = 1, 1, 1, 2, 2, 2, 3, 3, 3
    assert step.sens2.tolist() == pytest.approx([1, 1, 1, 2, 2, 2, 3, 3, 3], rel=1e-12)
    _, round_ctx = contexts(5)
    rho = []  # ρ of the events of the rounds that released (run_round records only those)
    for r in range(1, 10):
        ctx = round_ctx(r, 4)
        ctx.cohort_size = 4
        ev = step.privacy_events(ctx)
        if r == 4:  # round 4 released nothing (its server side never ran): charged with the next release
            assert len(ev) == 1
            continue
        step.server(torch.zeros(5), ctx)
        rho.append(sum(1 / (2 * e.noise_multiplier ** 2) for e in ev))
    unit = 1 / (2 * 1.5 ** 2)
    # rounds 1, 2, 3, 5, 6, 7, 8, 9 released: round 5 took round 4's increment, round 7 its own
    assert rho == pytest.approx([unit, 0, 0, unit, 0, unit, 0, 0], rel=1e-12)


def test_distributed_shares_sum_to_the_central_mechanism_and_need_every_client(contexts):
    """Every client's share S·σ/√N·(F Z⁽ⁱ⁾)_t from its own streams: their sum over the N clients has the
    central covariance (Sσ)² F Fᵀ; a round without every client releases nothing."""
    T, n, N = 5, 20_000, 4
    step = _step("tree", T, noise="distributed", schema=("any", 1))
    _, round_ctx = contexts(n)
    from dpfl.schemes.base import SetupContext

    step.setup(SetupContext(n_params=n, seeds=None, device=torch.device("cpu"), initial_params=torch.zeros(n),
                            n_clients=N))
    sums = []
    for r in range(1, T + 1):
        ctx = round_ctx(r, N)
        out = step.client(torch.zeros(N, n), ctx)
        assert not torch.equal(out[0], out[1])  # each client's own shares
        sums.append(out.to(torch.float64).sum(0).numpy() / (0.5 * 1.5))
    z = np.stack(sums)
    want = step.mf.noise_map @ step.mf.noise_map.T
    se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want ** 2) / n)
    assert np.all(np.abs(z @ z.T / n - want) < 6 * se + 1e-5)
    with pytest.raises(RoundAborted, match="needs all 4 clients' shares, 3 answered"):
        step.client(torch.zeros(3, n), round_ctx(1, 3))


# ---------------------------------------------------------------- runs


@pytest.mark.parametrize("opts,fed", [
    ({"correlated": "bandmf"}, CYCLIC),
    ({"correlated": "tree", "restart": 3}, MINSEP),
    ({"correlated": "tree", "completion": False}, CYCLIC),
])
def test_a_run_with_correlated_noise_trains_and_reports_the_accounted_epsilon(tmp_path, opts, fed):
    opts = {"epsilon": 30.0, "clip": 2.0, "noise": "central", **opts}  # little noise: 6 clients a round
    sim = Run(_cfg(opts, fed=fed), tmp_path / "a", log=lambda s: None)
    summary = simulate(sim)
    step = sim.scheme.steps[-1]
    assert isinstance(step, CorrelatedNoiseStep) and summary["epsilon_sampling"] == "none"
    m = _metrics(tmp_path / "a")
    eps = [r["epsilon"] for r in m]
    want = [F.run_epsilon(step.sigma, step.sens2[:r], 1e-5, "pld") for r in range(1, 7)]
    assert eps == pytest.approx(want, rel=1e-12)
    assert summary["epsilon_final"] == eps[-1] and 29.9 < eps[-1] <= 30.0  # σ calibrated for the 6 rounds
    assert [r["step_dp_mf_sensitivity"] for r in m] == pytest.approx(np.sqrt(step.sens2).tolist())
    assert max(r["accuracy"] for r in m) > 0.2  # it learns in 6 rounds (chance: 0.1)
    cohorts = [sim.select(r)[0] for r in range(1, 7)]  # the selection keeps to the schema
    for a in range(6):
        for b in range(a + 1, min(a + 3, 6)):
            assert not set(cohorts[a]) & set(cohorts[b])
    # same seed: bit-identical
    simulate(Run(_cfg(opts, fed=fed), tmp_path / "b", log=lambda s: None))
    assert _metrics(tmp_path / "b") == m
    assert (tmp_path / "a" / "summary.json").exists()


def test_a_resumed_bandmf_run_is_the_uninterrupted_one(tmp_path):
    opts = {"sigma": 2.0, "clip": 0.5, "noise": "central", "correlated": "bandmf"}
    simulate(Run(_cfg(opts, fed=CYCLIC), tmp_path / "full", log=lambda s: None))

    class Stop(Exception):
        pass

    def stop_after_4(m):
        if m["round"] == 4:
            raise Stop

    with pytest.raises(Stop):
        simulate(Run(_cfg(opts, fed=CYCLIC), tmp_path / "part", log=lambda s: None), on_round=stop_after_4)
    simulate(Run.resume(tmp_path / "part", log=lambda s: None))
    assert _metrics(tmp_path / "part") == _metrics(tmp_path / "full")
    with pytest.raises(DataError, match="keeps federation.rounds"):
        Run.resume(tmp_path / "part", log=lambda s: None, rounds=8)


def test_the_target_epsilon_stops_a_correlated_run_before_it_is_exceeded(tmp_path):
    opts = {"sigma": 2.0, "clip": 0.5, "noise": "central", "correlated": "bandmf"}
    _, s2, _ = F.build("bandmf", 6, "cyclic", 3)
    e3, e4 = (F.run_epsilon(2.0, s2[:r], 1e-5, "pld") for r in (3, 4))
    cfg = _cfg(opts, fed=CYCLIC)
    cfg.privacy.target_epsilon = (e3 + e4) / 2
    summary = simulate(Run(cfg, None, log=lambda s: None))
    assert summary["rounds_run"] == 3 and "exceed" in summary["stopped"]


def test_a_distributed_tree_run_over_the_secure_sum(tmp_path):
    opts = {"sigma": 1.0, "clip": 0.5, "correlated": "tree"}  # noise = distributed (default)
    sim = Run(_cfg(opts, rounds=3, fed={"clients_per_round": 60}), None, log=lambda s: None)
    assert sim.scheme.transport.secure
    summary = simulate(sim)
    assert summary["rounds_run"] == 3 and summary["epsilon_final"] > 0


# ---------------------------------------------------------------- what does not fit is one ConfigError line


@pytest.mark.parametrize("opts,fed,words", [
    ({"correlated": "bandmf", "noise": "central", "bands": 4}, CYCLIC, "bands = 4 needs a client's rounds ≥ 4 apart"),
    ({"correlated": "bandmf", "noise": "central"}, {}, "needs a client's rounds at least b apart"),
    ({"noise": "central"}, CYCLIC, "is accounted only with correlated noise"),
    ({"correlated": "tree"}, CYCLIC, "needs the same clients in every round's sum"),
    ({"correlated": "tree", "noise": "central", "bands": 2}, CYCLIC, "bands applies only to correlated = 'bandmf'"),
    ({"correlated": "bandmf", "noise": "central", "restart": 2}, CYCLIC, "restart applies only to correlated = 'tree'"),
    ({"restart": 2, "noise": "central"}, {}, "restart applies only to correlated = 'tree'"),
    ({"correlated": "tree", "noise": "local"}, CYCLIC, "not 'local'"),
    ({"correlated": "tree", "noise": "central", "clip": "adaptive"}, CYCLIC, "does not combine with correlated"),
])
def test_what_does_not_fit_the_schema_is_one_config_error_line(opts, fed, words):
    opts = {"sigma": 1.0, "clip": 0.5, **opts}
    with pytest.raises(ConfigError, match=words) as e:
        Run(_cfg(opts, fed=fed), None, log=lambda s: None)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("data,words", [
    ({"federation": {"participation": "cyclic"}}, "needs federation.groups"),
    ({"federation": {"groups": 3}}, "groups applies only to participation = 'cyclic'"),
    ({"federation": {"participation": "cyclic", "groups": 11, "clients_per_round": 6}}, "groups of 5"),
    ({"federation": {"participation": "cyclic", "groups": 3, "sampling": "poisson"}}, "sampling = 'fixed'"),
    ({"federation": {"participation": "cyclic", "groups": 3}, "privacy": {"sampling_assumption": "poisson"}},
     "sampling_assumption does not apply"),
    ({"scheme": {"name": "fl-std-dp", "options": {"correlated": "tree"}},
      "privacy": {"sampling_assumption": "poisson"}}, "sampling_assumption does not apply"),
])
def test_a_participation_schema_the_federation_cannot_keep_is_refused(data, words):
    base = {"data": {"n_clients": 60}, "federation": {"clients_per_round": 6}}
    merged = {**base, **data, "federation": {**base["federation"], **data.get("federation", {})}}
    with pytest.raises(ConfigError, match=words) as e:
        load_config(data=merged)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("scheme,opts,words", [
    ("fl-sign-dp", {"sigma": 1.0, "correlated": "tree"}, "no correlated-noise version"),
    ("qsgd-dp", {"sigma": 1.0, "clip": 0.5, "correlated": "tree"}, "not 'local'"),  # its default noise
])
def test_schemes_without_a_correlated_version_refuse_it(scheme, opts, words):
    env = {"n_params": 50, "cohort_size": 6, "n_clients": 60, "sampling": "without-replacement",
           "sampling_rate": 0.1, "rounds": 6, "privacy": PrivacyConfig(accountant="rdp", delta=1e-5), "seed": 0,
           "participation": ("cyclic", 3), "dropout": 0.0, "train": None}
    with pytest.raises(ConfigError, match=words):
        build_scheme(scheme, opts, env)
    if scheme == "qsgd-dp":  # central: the server's correlated noise covers the quantized rows' (1 + √B/s)·S
        built = build_scheme(scheme, {**opts, "noise": "central"}, env)
        assert isinstance(built.steps[-1], CorrelatedNoiseStep) and built.steps[-1].clip.bound > 0.5


def test_a_builder_without_the_runs_participation_refuses_correlated_noise():
    env = {"n_params": 50, "cohort_size": 6, "n_clients": 60, "sampling_rate": 0.1, "rounds": 6,
           "privacy": PrivacyConfig(accountant="rdp", delta=1e-5)}  # e.g. a deployed node's env today
    with pytest.raises(ConfigError, match="was not given"):
        build_scheme("fl-std-dp", {"sigma": 1.0, "clip": 0.5, "noise": "central", "correlated": "tree"}, env)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['participation'\]"):
        build_scheme("fl-std-dp", {"sigma": 1.0, "clip": 0.5, "participation": ("any", 1)}, env)
    assert math.isfinite(build_scheme("fl-std-dp", {"sigma": 1.0, "clip": 0.5}, env).steps[-1].sigma)
