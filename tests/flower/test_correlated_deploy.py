"""Correlated noise deployed with OS randomness (not seeded): DP-FTRL's tree draws a node's noise
again in later rounds, so a site's (and the server's) redrawn streams must give the same draw each
time, or the released prefix sums carry far more independent noise terms than the tree's
accounting assumes (and the printed ε is not the ε the data got)."""

from __future__ import annotations

import torch
from flower_helpers import config, loopback, require_row_contract, simulate

from dpfl.flower.node import OsSeeds
from dpfl.privacy.correlated import TreeNoise
from dpfl.privacy.factorization import build

ROUNDS = 4
# noise far above the updates (σ = 20, S = 0.5): the model's move is almost all noise
TREE = {"name": "fl-std-dp", "options": {"sigma": 20.0, "clip": 0.5, "correlated": "tree"}}


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
    assert any("not the one it had in round 1" in line for line in logs), logs
