"""Correlated noise deployed with OS randomness (not seeded): DP-FTRL's tree draws a node's noise
again in later rounds, so a site's (and the server's) redrawn streams must give the same draw each
time, or the released prefix sums carry far more independent noise terms than the tree's
accounting assumes (and the printed ε is not the ε the data got)."""

from __future__ import annotations

import pytest
import tomli_w
import torch
from flower_helpers import config, loopback, node_configs, require_row_contract, simulate

from dpfl.config import load_config
from dpfl.errors import ConfigError
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback
from dpfl.flower.node import OsSeeds
from dpfl.privacy.correlated import TreeNoise
from dpfl.privacy.factorization import build
from dpfl.run import checkpoint as ckpt
from dpfl.run.state import CHECKPOINT

ROUNDS = 4
# noise far above the updates (σ = 20, S = 0.5): the model's move is almost all noise
TREE = {"name": "fl-std-dp", "options": {"sigma": 20.0, "clip": 0.5, "correlated": "tree"}}
CENTRAL_TREE = {"name": "fl-std-dp", "options": {**TREE["options"], "noise": "central"}}


def _moved_var(w: torch.Tensor, w0: torch.Tensor) -> float:
    return float((w - w0).double().var())


def _tree_terms(t: int) -> tuple[int, int]:
    """Unit draws in the prefix sum of t rounds: when a redrawn node is the same draw (the tree's
    own: it cancels), and when every draw is fresh (each round's terms independent)."""
    mf, _, _ = build("tree", ROUNDS, "any", 1)
    tree = TreeNoise(mf)
    kept: dict[tuple, float] = {}
    for s in range(1, t + 1):
        for sign, key in tree.terms(s):
            kept[key] = kept.get(key, 0.0) + sign
    return sum(v * v for v in kept.values()), sum(len(tree.terms(s)) for s in range(1, t + 1))


def test_the_os_keyed_seeds_redraw_the_tree_nodes_and_nothing_else():
    a, b = OsSeeds(bytes(32)), OsSeeds(bytes(32))
    draw = [s.crypto("dp-mf-share", 3, "tree", 0, 1, 2).bytes(16) for s in (a, a, b)]
    assert draw[0] == draw[1] == draw[2]
    assert OsSeeds().crypto("dp-mf", "tree", 0).bytes(16) != draw[0]  # another key
    assert a.crypto("round", 1, "dpsgd-noise", 3).bytes(16) != a.crypto("round", 1, "dpsgd-noise", 3).bytes(16)


def test_deployed_tree_noise_with_os_randomness_is_the_trees_noise():
    """Sites on OS randomness (`dpfl-seeded = false`): after 4 rounds the model has moved by the
    tree's prefix-sum noise, as in the simulator (1 node's draw here), not by the sum of every
    round's fresh terms (7 draws: what OS-fresh streams for redrawn nodes gave)."""
    require_row_contract()
    same, fresh = _tree_terms(ROUNDS)
    assert fresh >= 4 * same  # the test can tell the two apart
    data = config(TREE, federation={"rounds": ROUNDS, "clients_per_round": 3})
    sim, _ = simulate(data)
    co, _ = loopback(data, seeded=False)
    w0 = co.state.w.clone()
    co.run()
    assert all("aborted" not in m for m in co.history)
    ratio = _moved_var(co.state.w, w0) / _moved_var(sim.w, w0)
    assert 0.7 < ratio < 1.5, (ratio, same, fresh)


def test_a_restarted_site_cannot_continue_distributed_tree_noise():
    """Its new secret would draw the earlier rounds' nodes afresh: it is refused (the round, which
    needs every site's share, releases nothing), with one line saying why."""
    require_row_contract()
    data = config(TREE, federation={"rounds": 3, "clients_per_round": 3})
    co, lb = loopback(data, seeded=False)
    node = lb.nodes[0]
    done = []

    def restart_after_round_1(kind: str, n: int) -> None:
        if kind == "train.sa_train" and co.state.round == 1 and not done:
            lb.restart(node)  # comes back with an empty state: a new secret
            done.append(n)

    lb.before = restart_after_round_1
    logs: list[str] = []
    co.log = logs.append
    co.run()
    assert done and "aborted" not in co.history[0]
    assert all("aborted" in m for m in co.history[1:]), co.history
    assert any("did not serve round 1" in line for line in logs), logs


class Crash(Exception):
    """The ServerApp process dies (kill -9)."""


def _server(data: dict, **kw):
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(data["data"]["n_clients"], seeded=False))
    return Coordinator(load_config(data=data), lb, lb.nodes, reproducible=False, log=lambda s: None, **kw), lb


def test_a_resumed_server_goes_on_with_its_tree_noise(tmp_path):
    """Central tree noise on OS randomness, the server killed after round 2 of 4 and resumed: the
    checkpoint keeps its noise key, so rounds 3-4 cancel rounds 1-2's nodes as the tree does (a new
    key would leave 5 independent draws in the prefix sum of 4 rounds instead of 1)."""
    require_row_contract()
    data = config(CENTRAL_TREE, federation={"rounds": ROUNDS, "clients_per_round": 3}, run={"checkpoint_every": 1})
    out = tmp_path / "run"
    co, lb = _server(data, out_dir=out)
    w0, key = co.state.w.clone(), co.state.seeds.key

    def crash_in_round_3(kind: str, calls: int) -> None:
        if kind == "train" and co.state.round == 2:
            raise Crash

    lb.before = crash_in_round_3
    with pytest.raises(Crash):
        co.run()
    co2, _ = _server(data, out_dir=out, resume=True)
    assert co2.state.round == 2 and co2.state.seeds.key == key
    co2.run()
    sim, _ = simulate(data)
    ratio = _moved_var(co2.state.w, w0) / _moved_var(sim.w, w0)
    assert 0.7 < ratio < 1.5, ratio


def test_a_reproducible_run_resumed_on_os_randomness_with_tree_noise_is_refused(tmp_path):
    require_row_contract()
    data = config(CENTRAL_TREE, federation={"rounds": ROUNDS, "clients_per_round": 3}, run={"checkpoint_every": 1})
    out = tmp_path / "run"
    lb2 = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(3))
    co = Coordinator(load_config(data=data), lb2, lb2.nodes, out_dir=out, reproducible=True,  # no key
                     log=lambda s: None)
    lb2.before = lambda kind, calls: (_ for _ in ()).throw(Crash) if co.state.round == 2 else None
    with pytest.raises(Crash):
        co.run()
    with pytest.raises(ConfigError, match="holds no server noise key"):
        _server(data, out_dir=out, resume=True)


def test_a_deployed_run_checkpoints_every_round_and_refuses_another_interval(tmp_path):
    """A round released after the last checkpoint would be released again on resume, with its noise
    uncounted (and, for the tree, the same noise on another aggregate): a deployed server checkpoints
    every round, and says that run.checkpoint_every does not apply."""
    require_row_contract()
    data = config(CENTRAL_TREE, federation={"rounds": 3, "clients_per_round": 3})  # default interval: 10
    co, lb = _server(data, out_dir=tmp_path / "a")
    rounds = []
    lb.before = lambda kind, calls: rounds.append(ckpt.load(tmp_path / "a" / CHECKPOINT)["round"]) \
        if kind == "train" and co.state.round else None
    co.run()
    assert rounds == [1, 2]  # round r's checkpoint is on disk before round r + 1's message leaves
    assert (tmp_path / "a" / CHECKPOINT).stat().st_mode & 0o077 == 0  # it holds the noise key
    lines: list[str] = []
    lb2 = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(3, seeded=False))
    Coordinator(load_config(data=data), lb2, lb2.nodes, out_dir=tmp_path / "b", log=lines.append)
    assert any("run.checkpoint_every = 10 does not apply to a deployed run" in line for line in lines)


def test_resumes_that_would_break_the_noise_are_refused(tmp_path):
    """Distributed correlated noise lives in the sites' states, which end with the Flower run; a run
    on OS randomness resumed reproducible would draw its remaining noise from the public seed."""
    require_row_contract()
    data = config(TREE, federation={"rounds": ROUNDS, "clients_per_round": 3})
    co, lb = _server(data, out_dir=tmp_path / "d")
    lb.before = lambda kind, calls: (_ for _ in ()).throw(Crash) if co.state.round == 2 else None
    with pytest.raises(Crash):
        co.run()
    with pytest.raises(ConfigError, match="distributed correlated noise cannot be resumed"):
        _server(data, out_dir=tmp_path / "d", resume=True)
    central = config(CENTRAL_TREE, federation={"rounds": ROUNDS, "clients_per_round": 3})
    co, lb = _server(central, out_dir=tmp_path / "c")
    lb.before = lambda kind, calls: (_ for _ in ()).throw(Crash) if co.state.round == 2 else None
    with pytest.raises(Crash):
        co.run()
    lb2 = Loopback({"dpfl-config": tomli_w.dumps(central)}, node_configs(3))
    with pytest.raises(ConfigError, match="resuming it reproducible"):
        Coordinator(load_config(data=central), lb2, lb2.nodes, out_dir=tmp_path / "c", reproducible=True,
                    resume=True, log=lambda s: None)
