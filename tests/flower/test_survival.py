"""A deployed run that survives: a lost site (tolerated as configured, at 3 sites), a site that
restarts and rejoins, a server that is killed and resumes, and a run whose rounds all abort.
In process (the ClientApp's handlers over `Loopback`); the same over a real SuperLink is in
test_deployment.py."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import tomli_w
import torch
from flower_helpers import (
    SIGN_DP,
    config,
    held_out_counts,
    node_configs,
    require_row_contract,
    simulate,
    site_files,
)

from dpfl.config import load_config
from dpfl.errors import ConfigError
from dpfl.flower import wire
from dpfl.flower.coordinator import Coordinator, Reply
from dpfl.flower.loopback import Loopback
from dpfl.run.state import CHECKPOINT, METRICS, RUN_FILES, SUMMARY

TOLERANT = {"name": "fl-sign-dp", "options": {**SIGN_DP["options"], "tolerate": 1}}


class Crash(Exception):
    """The ServerApp process dies (kill -9): nothing after this point runs."""


def _federation(data: dict, **kw) -> tuple[Coordinator, Loopback]:
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(data["data"]["n_clients"]))
    co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None, **kw)
    return co, lb


def _round_of(lb: Loopback, calls: int) -> int:
    """The round of the exchange under way: a secure round trains in train.sa_train, once."""
    return sum(kind == "train.sa_train" for kind, _ in lb.calls[:calls])


def test_three_sites_survive_losing_one_and_the_lost_site_rejoins():
    """kill of site 2 in round 2, after it shared its keys (tolerate = 1): round 2 completes with the
    other two, exactly their sum; the site restarts with an empty state during round 3, is refused
    for lack of keys when round 3's unmask message asks it to share round 4's, greeted again before
    round 4, which it sits out (its keys were shared without it), and answers from round 5 on. ε is
    charged every round as in the simulator (the noise is calibrated for one lost share)."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 5, "clients_per_round": 3})
    co, lb = _federation(data)

    def before(kind: str, calls: int) -> None:
        if kind == "train.sa_train" and _round_of(lb, calls) == 2:
            lb.kill(102)
        if kind == "train.sa_train" and _round_of(lb, calls) == 3:
            lb.restart(102)

    lb.before = before
    summary = co.run()
    _, ref = simulate(data)
    h = co.history
    assert [m["answered"] for m in h] == [3, 2, 2, 2, 3]
    assert [m["absent"] for m in h] == [[], [2], [2], [2], []]
    assert h[3]["rejoined"] == [2] and "rejoined" not in h[2]
    assert all("aborted" not in m for m in h) and summary["rounds_aborted"] == 0
    assert [m["epsilon"] for m in h] == [m["epsilon"] for m in ref]
    assert h[0]["accuracy"] == ref[0]["accuracy"]  # round 1 is the simulator's round
    assert summary["epsilon_final"] == ref[-1]["epsilon"]


def test_a_restarted_site_whose_errors_come_late_is_greeted_again():
    """As above, but the restarted site works through a backlog (messages sent while it was away),
    so its errors for round 3 come after their exchanges ended: the server finds them before round
    4 (`late_errors`), greets it again, and it answers from round 5 on. Before, such a site stayed
    "did not answer" for good and never rejoined."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 6, "clients_per_round": 3})
    lines: list[str] = []
    co, lb = _federation(data)
    co.log = lines.append

    def before(kind: str, calls: int) -> None:
        if kind == "train.sa_train" and _round_of(lb, calls) == 2:
            lb.kill(102)
        if kind == "train.sa_train" and _round_of(lb, calls) == 3:
            lb.restart(102)
            lb.slow[102] = 1_000  # every reply late, until its backlog is done: by the next hello
        if kind == "query" and lb.slow.pop(102, None):
            # one more backlog error comes while it is being greeted: of no more use once it is
            lb._late.append((102, Reply(None, "ProtocolError: round 3: a stale message", 0, 0)))

    lb.before = before
    co.run()
    h = co.history
    assert [m["answered"] for m in h] == [3, 2, 2, 2, 3, 3]  # greeted once, it sits out one round only
    assert h[3]["rejoined"] == [2] and all("rejoined" not in m for m in h[:3] + h[4:])
    assert any("round 4: node 102 answered an earlier message late, with an error: ProtocolError: round 4: this "
               "node has not advertised keys" in ln for ln in lines), lines


def test_a_site_that_erred_without_restarting_goes_on_without_sitting_out():
    """Site 1 answers round 2's training with an error (a passing fault; it keeps its state): it is
    greeted again before round 3, says it kept its state, and takes part in round 3, whose keys it
    had shared. Before, it was counted as rejoined and sat round 3 out."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 4, "clients_per_round": 3})
    lines: list[str] = []
    co, lb = _federation(data)
    co.log = lines.append
    real = lb.__call__

    def flaky(kind, contents, timeout, quorum=None):
        out = real(kind, contents, timeout, quorum)
        if kind == "train.sa_train" and _round_of(lb, len(lb.calls)) == 2 and 101 in out:
            out[101] = Reply(None, "RuntimeError: a passing fault", 0, 0)
        return out

    co.exchange = flaky
    co.run()
    h = co.history
    assert [m["answered"] for m in h] == [3, 2, 3, 3] and all("rejoined" not in m for m in h)
    assert any("round 3: node 101 kept its state (its error was not a restart): client 1 is not made to sit out"
               in ln for ln in lines), lines


def test_a_restarted_site_that_says_it_kept_its_state_with_new_keys_is_taken_as_restarted():
    """Unseeded sites: site 2 restarts with a new secret (new round keys) and its hello claims
    fresh = false. The keys differ from the ones it shared, so it is counted as rejoined and sits
    out the round whose keys were shared without it, as any restarted site."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 5, "clients_per_round": 3})
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(3, seeded=False))
    co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None)
    real = lb.__call__

    def before(kind: str, calls: int) -> None:
        if kind == "train.sa_train" and _round_of(lb, calls) == 2:
            lb.kill(102)
        if kind == "train.sa_train" and _round_of(lb, calls) == 3:
            lb.restart(102)

    def lying(kind, contents, timeout, quorum=None):
        out = real(kind, contents, timeout, quorum)
        if kind == "query" and 102 in out and out[102].content is not None and co.history:
            out[102].content[wire.REPLY]["fresh"] = False
        return out

    lb.before = before
    co.exchange = lying
    co.run()
    h = co.history
    assert [m["answered"] for m in h] == [3, 2, 2, 2, 3] and h[3]["rejoined"] == [2]


def test_a_restarted_site_under_a_new_node_id_takes_its_client_back():
    """Without node authentication a restarted SuperNode gets a new node id: the server greets it
    before the next round, whose keys were shared without it, and serves its client from the round
    after."""
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 3, "clients_per_round": 3})
    co, lb = _federation(data)

    def before(kind: str, calls: int) -> None:
        if kind == "train.sa_train" and _round_of(lb, calls) == 1:
            lb.kill(101)
        if kind == "train.sa_unmask" and _round_of(lb, calls) == 1:
            lb.restart(101, new_id=201)

    lb.before = before
    co.run()
    assert [m["answered"] for m in co.history] == [2, 2, 3]
    assert co.history[1]["rejoined"] == [1] and co.node_of[1] == 201


def test_a_node_cannot_take_a_client_that_is_still_served():
    require_row_contract()
    data = config(TOLERANT, federation={"rounds": 2, "clients_per_round": 3})
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)},
                  {**node_configs(3), 300: {"partition-id": 0, "num-partitions": 3, "dpfl-seeded": False}})
    lb.down.add(300)  # connects only after the hello
    lines: list[str] = []
    co = Coordinator(load_config(data=data), lb, [100, 101, 102], reproducible=True, log=lines.append)
    kept = []

    def before(kind: str, calls: int) -> None:
        if calls == 2:
            lb.down.discard(300)
            kept.append(copy.deepcopy(co.round_keys[0]))

    lb.before = before
    co.run()
    assert co.node_of[0] == 100 and [m["answered"] for m in co.history] == [3, 3]
    assert any("node 300 claims client 0, which node 100 still serves: refused" in ln for ln in lines)
    assert co.round_keys[0] == kept[0]  # its own keys (a fresh secret) did not replace client 0's


def test_a_killed_server_resumes_with_its_ledger_and_ends_as_an_uninterrupted_run(tmp_path):
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 4, "clients_per_round": 3}, run={"checkpoint_every": 1})
    out = tmp_path / "run"
    co, lb = _federation(data, out_dir=out)

    def before(kind: str, calls: int) -> None:
        if _round_of(lb, calls) == 3 and kind == "train.sa_train":
            raise Crash

    lb.before = before
    with pytest.raises(Crash):
        co.run()
    assert len((out / METRICS).read_text().splitlines()) == 2 and (out / CHECKPOINT).is_file()
    with pytest.raises(ConfigError, match="already holds a deployed run"):
        _federation(data, out_dir=out)
    other = config(SIGN_DP, federation={"rounds": 4, "clients_per_round": 3}, run={"checkpoint_every": 1}, seed=6)
    with pytest.raises(ConfigError, match="differs from the one"):
        _federation(other, out_dir=out, resume=True)
    co2, _ = _federation(data, out_dir=out, resume=True)  # a new Flower run: the nodes' states are new
    assert co2.state.round == 2 and co2.state.ledger.epsilon(1e-5) > 0
    summary = co2.run()
    sim, ref = simulate(data)
    assert torch.equal(co2.state.w, sim.w)
    assert summary["epsilon_final"] == ref[-1]["epsilon"] and summary["rounds_run"] == 4
    lines = [json.loads(ln) for ln in (out / METRICS).read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3, 4]
    # round 2's line was written before the crash without its federated evaluation: the resumed run's
    # first training message carried it, and the line is complete
    assert all(m["fed_sites"] == 3 for m in lines)
    assert [m["epsilon"] for m in lines] == [m["epsilon"] for m in ref]
    assert [m["accuracy"] for m in lines] == [m["accuracy"] for m in ref]
    assert {p.name for p in out.iterdir()} == set(RUN_FILES)  # a simulated run's files, no more
    assert json.loads((out / SUMMARY).read_text())["best"]["round"] in range(1, 5)


def test_a_run_whose_rounds_all_abort_says_so():
    """tolerate = 0 and one site lost for good: every round aborts; `answered` counts who answered,
    and the summary's stop reason says that nothing was released."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 3, "clients_per_round": 3})
    co, lb = _federation(data)
    lb.before = lambda kind, calls: lb.kill(102) if kind == "train.sa_train" else None
    summary = co.run()
    assert [m["answered"] for m in co.history] == [2, 2, 2]
    assert all("aborted" in m for m in co.history) and summary["rounds_aborted"] == 3
    assert summary["stopped"].startswith("all 3 rounds aborted")
    assert co.state.ledger.events == [] and summary["epsilon_final"] == 0


def test_sites_on_their_own_files_with_federated_evaluation_match_the_simulator(tmp_path):
    """Site 0 holds a CSV, sites 1 and 2 .npz files (training and held-out, as `dpfl data export`
    writes them): the deployed run equals the simulator fed the same partition, and the sites'
    evaluation counts add up to the global model's accuracy on the union of their held-out data."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 2, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)},
                  {100 + i: {"partition-id": i, "num-partitions": 3, "dpfl-seeded": True, **files[i]} for i in files})
    out = tmp_path / "out"
    co = Coordinator(load_config(data=data), lb, lb.nodes, out_dir=out, reproducible=True, log=lambda s: None)
    co.run()
    sim, ref = simulate(data)
    assert torch.equal(co.state.w, sim.w)
    # two exchanges a round: round 2's keys came with round 1's unmasking, round 1's model was evaluated
    # by the sites with round 2's training message, round 2's in an exchange of its own
    assert [k for k, _ in lb.calls] == ["query", "train.sa_keys", "train.sa_train", "train.sa_unmask",
                                        "train.sa_train", "train.sa_unmask", "evaluate"]
    sim1, _ = simulate(config(SIGN_DP, federation={"rounds": 1, "clients_per_round": 3}))
    lines = [json.loads(ln) for ln in (out / METRICS).read_text().splitlines()]
    for m in (co.history, lines):
        for got, w in zip(m, (sim1.w, sim.w)):
            want = held_out_counts(data, w)
            assert got["fed_sites"] == 3 and got["fed_examples"] == want["n"]
            assert got["fed_accuracy"] == want["correct"] / want["n"]
    assert co.history[-1]["accuracy"] == ref[-1]["accuracy"]  # the server's own evaluation, as in the simulator


def test_a_site_file_the_model_cannot_take_is_one_line(tmp_path):
    from dpfl.errors import DataError
    from dpfl.flower.node import LocalClient, NodeSettings

    data = config(SIGN_DP)
    bad = tmp_path / "wide.npz"
    np.savez(bad, x=np.zeros((5, 70), np.float32), y=np.zeros(5, np.int64))
    with pytest.raises(DataError, match=r"wide.npz: model 'mlp' does not take its examples \(shape \[70\]\)"):
        LocalClient(load_config(data=data), NodeSettings(0, str(bad)))
    labels = tmp_path / "labels.npz"
    np.savez(labels, x=np.zeros((5, 64), np.float32), y=np.full(5, 12, np.int64))
    with pytest.raises(DataError, match=r"labels.npz: labels 12..12 \(multiclass\), the model predicts 10 classes"):
        LocalClient(load_config(data=data), NodeSettings(0, str(labels)))
    with pytest.raises(ConfigError, match="unknown node config keys"):
        NodeSettings.parse({"partition-id": 0, "data_path": "x"}, 3)


def test_a_stale_node_the_superlink_still_lists_is_left_out_at_hello():
    """A SuperLink on a database lists nodes of earlier runs that are gone: the hello asks every
    listed node, leaves out those that do not answer, and runs with one node per client."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 1, "clients_per_round": 3})
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)},
                  {**node_configs(3), 99: {"partition-id": 1, "num-partitions": 3, "dpfl-seeded": True}})
    lb.kill(99)
    lines: list[str] = []
    co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lines.append)
    co.run()
    assert co.node_of == {0: 100, 1: 101, 2: 102} and co.history[0]["answered"] == 3
    assert any(ln.startswith("node 99 left out: did not answer the hello") for ln in lines)
