"""fl-std / fedavg with `secure = true`: each client clips its update to L2 norm S, the updates reach
the server only as a fixed-point secure sum (`SecAggTransport`), the server takes the mean over
the clients in the sum; no client-level noise (the cross-silo recipe pairs it with train.dpsgd)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli.main import app
from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.run.state import Run
from dpfl.schemes.aggregators import MeanAggregator
from dpfl.schemes.dp import ClipStep, clip_rows
from dpfl.schemes.registry import build_scheme
from dpfl.schemes.round import check_dpsgd
from dpfl.schemes.secure_sum import SecAggTransport
from dpfl.secagg import ring

# 3 equal shards of the 8x8 digits, a 64-16-10 MLP, DP-SGD in every client with σ given
BASE = {
    "name": "secure-fedavg", "seed": 3,
    "data": {"dataset": "digits", "n_clients": 3, "partition": "shards"},
    "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
    "train": {"steps": 4, "batch_size": 32, "lr": 0.2,
              "dpsgd": {"clip": 1.0, "noise_multiplier": 1.0, "target_epsilon": 8.0}},
    "federation": {"rounds": 1, "clients_per_round": 3},
    "scheme": {"name": "fl-std", "options": {"secure": True, "clip": 5.0}},
    "run": {"engine": "sequential", "threads": 1},
}


def _config(**sections) -> dict:
    data = copy.deepcopy(BASE)
    for k, v in sections.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    return data


def _run(data: dict) -> tuple[Run, list[dict]]:
    sim = Run(load_config(data=data), None, log=lambda s: None)
    rounds: list[dict] = []
    simulate(sim, rounds.append)
    return sim, rounds


def test_dpfl_schemes_lists_the_secure_option():
    r = CliRunner().invoke(app, ["schemes"], prog_name="dpfl", terminal_width=300)
    assert r.exit_code == 0
    text = " ".join(r.output.split())  # the console wraps long descriptions
    fl_std = text.split("fl-std FL-STD")[1].split("fl-std-dp")[0]
    assert "secure = true: updates clipped to clip, secure sum (fixed point), mean, no client-level noise" in fl_std
    assert "fedavg FedAvg (McMahan et al.), same as fl-std (secure = true likewise)" in text


@pytest.mark.parametrize("name", ["fl-std", "fedavg"])
def test_the_secure_option_builds_clip_secure_sum_and_mean(name):
    s = build_scheme(name, {"secure": True, "clip": 2.5}, {"cohort_size": 3})
    (clip,) = s.steps
    assert isinstance(clip, ClipStep) and clip.bound == 2.5 and not s.private
    t = s.transport
    assert isinstance(t, SecAggTransport) and t.secure and t.encoding == "fixed"
    assert (t.clip_range, t.frac_bits, t.max_dropouts) == (2.5, 20, 0)
    assert isinstance(s.aggregator, MeanAggregator)
    assert s.describe() == f"{name}: clip(S=2.5, given) | secagg(fixed, ±2.5, 2^-20, l=0) | mean"
    check_dpsgd(s)  # train.dpsgd combines with it
    plain = build_scheme(name, {}, {"cohort_size": 3})  # the default is unchanged
    assert plain.describe() == f"{name}: (identity) | plain/float32 | weighted_mean"


@pytest.mark.parametrize("options, message", [
    ({"secure": True}, "secure = true needs clip"),
    ({"secure": True, "clip": 0}, "secure = true needs clip"),
    ({"secure": True, "clip": math.inf}, "secure = true needs clip"),
    ({"clip": 1.0}, "apply only with secure = true"),
    ({"frac_bits": 16}, "apply only with secure = true"),
    ({"secure": "yes", "clip": 1.0}, "secure must be true or false"),
    ({"secure": True, "clip": 1.0, "frac_bits": 60}, r"frac_bits must be an integer in \[0, 52\]"),
    ({"secure": True, "clip": 1.0, "tolerate": -1}, "tolerate must be an integer"),
    ({"secure": True, "clip": 1.0, "tolerate": 2}, "cannot tolerate"),
    ({"secure": True, "clip": 1.0, "noise": 1.0}, r"unknown option\(s\) \['noise'\]"),
])
def test_bad_options_are_one_config_error(options, message):
    with pytest.raises(ConfigError, match=message):
        build_scheme("fl-std", options, {"cohort_size": 3})


def test_a_weighted_mean_is_refused_under_the_secure_sum():
    data = _config(scheme={"aggregator": "weighted_mean"})
    with pytest.raises(ConfigError, match="needs individual updates"):
        Run(load_config(data=data), None, log=lambda s: None).setup()


def test_the_secure_mean_is_the_mean_of_the_clipped_updates(contexts):
    k, d, S, f = 3, 4000, 2.0, 16
    s = build_scheme("fl-std", {"secure": True, "clip": S, "frac_bits": f}, {"cohort_size": k})
    _, round_ctx = contexts(d)
    ctx = round_ctx(1, k)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(k, d, generator=g) * torch.tensor([[0.01], [0.05], [0.2]])  # norms ~0.6, 3.2, 12.6
    want = clip_rows(u, S)[0].double().mean(0)
    rows = s.steps[0].client(u.clone(), ctx)
    assert ctx.metrics["dp_clip_fraction"] == pytest.approx(2 / 3)
    assert rows.abs().max() <= S  # an L2 bound S holds every coordinate in the fixed-point range ±S
    rec = s.transport.transmit(rows, ctx)
    assert rec.rows is None and rec.count == k
    mean = s.aggregator(rec, ctx)
    assert (mean.double() - want).abs().max() < 2.0**-f  # each row rounds by less than one step 2^-f
    bits = ring.fixed_point_bits(S, f, k)
    assert ctx.metrics["secagg_bits"] == bits == s.transport.bits_per_value
    assert (rec.upstream_bytes == 13 + -(-d * bits // 8)).all()


@pytest.mark.parametrize("frac_bits", [8, 20])
def test_a_digits_run_equals_plain_fedavg_within_fixed_point_rounding(frac_bits):
    """Same seed, same sampled batches and DP-SGD noise in every site: the secure round's model is
    plain FL-STD's (weighted mean = mean: equal shards) up to the fixed-point rounding, < 2^-f."""
    secure, (m,) = _run(_config(scheme={"options": {"secure": True, "clip": 5.0, "frac_bits": frac_bits}}))
    plain, (ref,) = _run(_config(scheme={"options": {}}))
    diff = float((secure.w - plain.w).abs().max())
    assert diff < 2.0**-frac_bits + 1e-6  # + float32 rounding of the mean and of w + Δ
    if frac_bits == 8:
        assert diff > 1e-4  # the rounding is there: the two runs are not trivially the same
    assert m["step_dp_clip_fraction"] == 0.0  # S = 5 does not bind here
    assert m["step_secagg_bits"] == ring.fixed_point_bits(5.0, frac_bits, 3)
    assert m["record_epsilon_max"] == ref["record_epsilon_max"] > 0  # the sites' record-level ε
    assert "epsilon" not in m  # no client-level ledger: there is no client-level noise
    assert abs(m["accuracy"] - ref["accuracy"]) < 0.02


def test_a_seeded_in_process_deployment_equals_the_simulator():
    """Over the deployment's messages (dpfl.flower.loopback: the ClientApp handlers, the coordinator, the
    SecAgg phases), seeded clients give the simulator's model bit for bit, with DP-SGD and without."""
    pytest.importorskip("flwr")
    import tomli_w

    from dpfl.flower.coordinator import Coordinator
    from dpfl.flower.loopback import Loopback

    def deployed(data):
        nodes = {100 + i: {"partition-id": i, "num-partitions": 3, "dpfl-seeded": True} for i in range(3)}
        lb = Loopback({"dpfl-config": tomli_w.dumps(data)}, nodes)
        co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None)
        co.run()
        return co

    no_dpsgd = _config(federation={"rounds": 2})
    del no_dpsgd["train"]["dpsgd"]
    sim, rounds = _run(no_dpsgd)
    co = deployed(no_dpsgd)
    assert torch.equal(co.state.w, sim.w)
    for mine, ref in zip(co.history, rounds):
        assert mine["up_bytes"] == ref["up_bytes"] and mine["step_secagg_bits"] == ref["step_secagg_bits"]
    # 20 DP-SGD steps, 3 rounds: a site padding its Poisson batches to its own largest (not the
    # cohort's, as the simulator does) ended 3.3e-7 away, which the secure sum's stochastic rounding
    # then amplifies (docs/RESULTS.md, "Deployment over Flower")
    data = _config(federation={"rounds": 3}, train={"steps": 20})
    sim, rounds = _run(data)
    co = deployed(data)
    assert torch.equal(co.state.w, sim.w)  # seeded sites pad their DP-SGD batches as the simulator does
    assert [m["record_epsilon_max"] for m in co.history] == [m["record_epsilon_max"] for m in rounds]
    assert np.isfinite([m["accuracy"] for m in co.history]).all()
