"""DP schemes in the simulator: the accountant in the loop, target ε, calibration, resume."""

import json

import pytest
import torch

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.privacy import (
    GaussianEvent,
    Ledger,
    PureDPEvent,
    SampledGaussianEvent,
    calibrate_sigma,
    epsilon_for,
)
from dpfl.run.state import Run

TIMING = ("train_seconds", "eval_seconds", "round_seconds", "step_secagg_seconds", "step_dp_noise_seconds")


def _cfg(scheme, rounds=3, accountant="rdp", target=None, sampling="poisson", **opts):
    privacy = {"accountant": accountant, "delta": 1e-5}
    if sampling is not None:  # these tests check the Poisson-accounted ledger (a fixed cohort of 6 of 60)
        privacy["sampling_assumption"] = sampling
    if target is not None:
        privacy["target_epsilon"] = target
    return load_config(data={
        "name": "dp", "seed": 5,
        "data": {"dataset": "digits", "n_clients": 60, "public_size": 10},
        "federation": {"rounds": rounds, "clients_per_round": 6},
        "train": {"steps": 2, "batch_size": 10, "lr": 0.1},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "scheme": {"name": scheme, "options": opts},
        "privacy": privacy, "eval": {"every": 1}, "run": {"checkpoint_every": 2},
    })


def _metrics(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def test_epsilon_per_round_is_the_accountants(tmp_path):
    sim = Run(_cfg("fl-std-dp", sigma=1.1, clip=0.5), tmp_path, log=lambda s: None)
    simulate(sim)
    eps = [m["epsilon"] for m in _metrics(tmp_path)]
    assert eps == [pytest.approx(epsilon_for(1.1, 0.1, r, 1e-5, "rdp"), rel=1e-12) for r in (1, 2, 3)]
    assert sim.summary()["best"]["epsilon"] in eps  # ε reported at the best round


def test_target_epsilon_stops_before_it_is_exceeded(tmp_path):
    e2, e3 = (epsilon_for(1.1, 0.1, r, 1e-5, "moments") for r in (2, 3))
    sim = Run(_cfg("fl-sign-dp", rounds=5, accountant="moments", target=(e2 + e3) / 2, sigma=1.1),
                     tmp_path, log=lambda s: None)
    summary = simulate(sim)
    assert summary["rounds_run"] == 2 and "exceed" in summary["stopped"]
    # DG event: Thm 3 corrections vanish here, so ε is the sampled Gaussian's (plus a ~1e-30 TV term)
    assert summary["epsilon_final"] == pytest.approx(e2, rel=1e-9)
    assert summary["epsilon_final"] <= (e2 + e3) / 2


def test_epsilon_option_calibrates_sigma_for_the_run():
    sim = Run(_cfg("fl-rnd-dp", rounds=4, epsilon=2.0, ratio=0.2, clip=0.3), None, log=lambda s: None)
    sigma = sim.scheme.steps[-1].sigma
    assert sigma == calibrate_sigma(2.0, 1e-5, 0.1, 4, "rdp")
    assert epsilon_for(sigma, 0.1, 4, 1e-5) <= 2.0


def test_private_clip_is_charged_and_resume_is_bit_identical(tmp_path):
    opts = {"sigma": 1.2, "ratio": 0.2, "chunks": 4, "clip": "private", "clip_epsilon": 0.5}
    full = tmp_path / "full"
    simulate(Run(_cfg("fl-cs-dp", rounds=4, **opts), full, log=lambda s: None))
    part = tmp_path / "part"
    simulate(Run(_cfg("fl-cs-dp", rounds=2, **opts), part, log=lambda s: None))
    simulate(Run.resume(part, log=lambda s: None, rounds=4))
    a, b = _metrics(full), _metrics(part)
    assert len(a) == len(b) == 4 and a == b
    ref = Ledger("rdp")
    ref.add(PureDPEvent(0.5))
    ref.add(SampledGaussianEvent(1.2, 0.1), count=4)
    assert a[-1]["epsilon"] == pytest.approx(ref.epsilon(1e-5), rel=1e-12)
    assert a[-1]["epsilon"] > epsilon_for(1.2, 0.1, 4, 1e-5)  # the selection cost is in ε


@pytest.mark.parametrize("scheme,opts,match", [
    ("fl-sign-dp", {"sigma": 1.0, "epsilon": 1.0}, "exactly one of sigma"),
    ("fl-std-dp", {"sigma": 1.0, "clip": "median"}, "clip must be"),
    ("fl-std-dp", {"sigma": 1.0, "noise": "local", "secure_aggregation": True}, "must be false"),
    ("fl-std-dp", {"sigma": 1.0, "noise": "central", "neighbours": 4},
     "only apply to secure aggregation"),
    ("fl-top-dp", {"sigma": 1.0, "tolerate": 6}, "must be < the cohort size"),
    ("fl-std-dp", {"sigma": 1.0, "gamma": 0.1}, "unknown option"),
])
def test_bad_options_name_the_problem(scheme, opts, match):
    with pytest.raises(ConfigError, match=match):
        Run(_cfg(scheme, **opts), None, log=lambda s: None)


def test_fl_sign_dp_refuses_the_pld_accountant():
    with pytest.raises(ConfigError, match="'rdp' or 'moments'"):
        Run(_cfg("fl-sign-dp", accountant="pld", sigma=1.0), None, log=lambda s: None)


def test_central_and_local_placements_run_end_to_end(tmp_path):
    simulate(Run(_cfg("fl-sign-dp", rounds=2, sigma=1.0, noise="central"), tmp_path / "c", log=lambda s: None))
    m = _metrics(tmp_path / "c")
    n = 64 * 16 + 16 + 16 * 10 + 10
    assert [r["step_up_bits_per_value"] for r in m] == [8 * -(-n // 8) / n] * 2  # a trusted server: plain 1-bit signs
    assert [r["epsilon"] for r in m] == [pytest.approx(epsilon_for(1.0, 0.1, t, 1e-5), rel=1e-9) for t in (1, 2)]

    simulate(Run(_cfg("fl-std-dp", rounds=3, sigma=2.0, clip=0.3, noise="local"), tmp_path / "l",
               log=lambda s: None))
    m = _metrics(tmp_path / "l")
    assert all(r["step_up_bits_per_value"] == 32.0 for r in m)
    per_count = []
    for c in (1, 2, 3):
        led = Ledger("rdp")
        led.add(GaussianEvent(1.0), count=c)  # σ/2: replace-one sensitivity 2S, no amplification
        per_count.append(led.epsilon(1e-5))
    eps = [r["epsilon"] for r in m]
    assert eps[0] == pytest.approx(per_count[0], rel=1e-12)
    assert all(any(e == pytest.approx(p, rel=1e-12) for p in per_count[: t + 1]) for t, e in enumerate(eps))
    assert eps == sorted(eps)


def test_a_round_with_more_failures_than_tolerated_releases_nothing(tmp_path):
    # cohort 6, ⌊0.34·6⌋ = 2 drop after masking > l = 1: every round aborts
    sim = Run(_cfg("fl-std-dp", rounds=2, sigma=1.0, clip=0.5, tolerate=1, drop_after_masking=0.34),
                     tmp_path, log=lambda s: None)
    w0 = sim.w.clone()
    simulate(sim)
    m = _metrics(tmp_path)
    assert len(m) == 2 and all("aborted" in r for r in m)
    assert sim.ledger.events == [] and all(r["epsilon"] == 0.0 for r in m)
    assert bool((sim.w == w0).all())


def test_noise_shares_and_record_noise_do_not_depend_on_the_thread_count():
    """Distributed noise shares and DP-SGD noise inside the clients are drawn on a thread pool
    (dpfl.threads.for_each); each row from its own generator, so the run is the same bits."""
    before, weights = torch.get_num_threads(), []
    try:
        for threads in (1, 3):
            cfg = _cfg("fl-std-dp", rounds=2, sigma=1.1, clip=0.5)
            data = cfg.model_dump()
            data["train"]["dpsgd"] = {"clip": 1.0, "noise_multiplier": 1.1}
            data["run"]["threads"] = threads
            sim = Run(load_config(data=data), None, log=lambda s: None)
            simulate(sim)
            assert torch.get_num_threads() == threads
            weights.append(sim.w.clone())
    finally:
        torch.set_num_threads(before)
    assert torch.equal(weights[0], weights[1])
