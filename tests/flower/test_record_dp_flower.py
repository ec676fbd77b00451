"""train.dpsgd over the deployment's message protocol (in process): the clients run the
simulator's DP-SGD code path and keep their own record-level budget."""

from __future__ import annotations

import pytest
import torch
from flower_helpers import config, loopback, simulate

from dpfl.config import load_config
from dpfl.errors import ConfigError
from dpfl.flower import client as fclient
from dpfl.flower.node import LocalClient, NodeSettings

DP = {"steps": 2, "batch_size": 8, "lr": 0.1, "dpsgd": {"clip": 1.0, "noise_multiplier": 1.2}}


def test_seeded_clients_match_the_simulator_and_report_record_epsilon():
    data = config(train=DP)
    sim, sim_rounds = simulate(data)
    co, lb = loopback(data)
    co.run()
    # same samples, noise streams and batch padding (seeded sites pad to the cohort's largest batch)
    assert torch.equal(co.state.w, sim.w)
    assert not torch.equal(co.state.w, simulate(config())[0].w)
    for mine, ref in zip(co.history, sim_rounds):
        assert mine["record_epsilon_max"] == ref["record_epsilon_max"]
        assert mine["record_epsilon_per_client"] == ref["record_epsilon_per_client"]
    for n in lb.nodes:  # each client counted its own steps: 3 rounds × 2 steps
        assert sum(lb.states[n][fclient.RECORD].values()) == 6


def test_clients_stop_training_at_their_own_record_budget():
    import tomli_w

    co, lb = loopback(config(train=DP))
    co.hello()
    first = co.step_round()
    w1 = co.state.w.clone()
    # the clients' own config now caps ε just above one round's cost: none trains again
    tight = config(train={**DP, "dpsgd": {**DP["dpsgd"], "target_epsilon": first["record_epsilon_max"] * 1.01}})
    lb.run_config = {"dpfl-config": tomli_w.dumps(tight)}
    second = co.step_round()
    spent = {n: sum(lb.states[n][fclient.RECORD].values()) for n in lb.nodes}
    # the client with the largest ε refuses before spending anything; the round goes on without it
    assert min(spent.values()) == 2 and set(spent.values()) <= {2, 4}
    assert second["answered"] == sum(v == 4 for v in spent.values()) < 3
    assert not torch.equal(co.state.w, w1) if second["answered"] else torch.equal(co.state.w, w1)


def test_deployment_needs_an_explicit_noise_multiplier():
    cfg = load_config(data=config(train={**DP, "dpsgd": {"clip": 1.0, "target_epsilon": 2.0}}))
    with pytest.raises(ConfigError, match="noise_multiplier"):
        LocalClient(cfg, NodeSettings(0, None, True))


def test_fsvrg_with_record_dp_is_refused_before_a_client_sends_its_raw_gradient():
    """FSVRG's clients send ∇f_k(w_t) of their data before training: DP-SGD would not cover it.
    The server refuses the config, and so does each client on its own (it builds its scheme first)."""
    from dpfl.run.state import Run

    cfg = load_config(data=config({"name": "fsvrg"}, train=DP))
    with pytest.raises(ConfigError, match="without DP-SGD noise"):
        LocalClient(cfg, NodeSettings(0, None, True))
    with pytest.raises(ConfigError, match="without DP-SGD noise"):
        Run(cfg, None, log=lambda s: None)


def test_a_run_every_client_refuses_says_why():
    """Every client's record-level budget is spent before its first step: every round aborts, and the
    stop reason quotes a client's error (before: "no client answered", the reason only in the log)."""
    co, _ = loopback(config(train={**DP, "dpsgd": {**DP["dpsgd"], "target_epsilon": 0.01}}))
    summary = co.run()
    assert summary["rounds_aborted"] == 3
    assert summary["stopped"].startswith("all 3 rounds aborted (the last: round 3: no client answered (3 answered "
                                         "with an error; client 0: "), summary["stopped"]
    assert "BudgetExceededError: this client would reach record-level ε" in summary["stopped"]
