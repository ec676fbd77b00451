"""The deployment's server and client code, in process (no SuperLink): same messages, same
handlers, same coordinator as over Flower, checked against the simulator."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flower_helpers import SIGN_DP, config, loopback, recording_words, require_row_contract, simulate
from flwr.app import Array, ArrayRecord, RecordDict

from dpfl.errors import ProtocolError
from dpfl.flower import client as fclient
from dpfl.flower import wire
from dpfl.flower.loopback import Loopback
from dpfl.schemes.base import Aggregator
from dpfl.secagg.ring import centred_lift


def test_unseeded_clients_draw_noise_the_config_seed_does_not_determine():
    data = config(SIGN_DP, federation={"rounds": 1})
    sim, _ = simulate(data)
    a, _ = loopback(data, seeded=False)
    b, _ = loopback(data, seeded=False)
    a.run()
    b.run()
    assert not torch.equal(a.state.w, b.state.w)
    assert not torch.equal(a.state.w, sim.w)


class Recording(Loopback):
    """Keeps each node's encoded row (its words in Z_2^b) and lets chosen nodes fail a phase."""

    def __init__(self, run_config, node_configs, fail: dict[str, set[int]] | None = None):
        super().__init__(run_config, node_configs)
        self.fail = fail or {}
        self.words: dict[int, np.ndarray] = {}

    def __call__(self, kind, contents, timeout, quorum=None):
        failing = self.fail.get(kind, set())
        keep = {n: c for n, c in contents.items() if n not in failing}
        if kind != "train.sa_train":
            return super().__call__(kind, keep, timeout, quorum)
        at: dict[int, np.ndarray] = {}
        with recording_words(at):
            out = super().__call__(kind, keep, timeout, quorum)
        for n, c in keep.items():
            i = wire.RoundPlan.from_record(c[wire.PLAN]).index
            if i in at:
                self.words[n] = at[i]
        return out  # failing nodes never answer


class RecordingAggregator(Aggregator):
    """The scheme's aggregator, keeping what the server received."""

    def __init__(self, inner: Aggregator):
        self.inner, self.name, self.needs_rows = inner, inner.name, inner.needs_rows
        self.got: list = []

    def __call__(self, rec, ctx):
        self.got.append(rec)
        return self.inner(rec, ctx)


def _record_received(co):
    co.scheme.aggregator = RecordingAggregator(co.scheme.aggregator)
    return co.scheme.aggregator.got


def test_a_client_lost_after_sharing_keys_is_recovered_and_the_sum_is_the_survivors():
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 1, "clients_per_round": 4})
    co, lb = loopback(data, cls=Recording, fail={"train.sa_train": {103}})
    got = _record_received(co)
    co.run()
    (rec,) = got
    assert rec.count == 3 and co.history[0]["answered"] == 3
    bits = int(co.history[0]["step_secagg_bits"])
    expect = sum(lb.words[n].astype(np.uint64) for n in (100, 101, 102))
    assert np.array_equal(rec.total.numpy(), centred_lift(expect, bits))  # pairwise masks of 103 removed
    assert co.state.ledger.events  # released: the event was recorded


def test_more_failures_than_tolerated_release_nothing():
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 1, "clients_per_round": 4})
    co, _ = loopback(data, cls=Recording, fail={"train.sa_train": {102, 103}})
    w0 = co.state.w.clone()
    co.run()
    assert "aborted" in co.history[0]
    assert torch.equal(co.state.w, w0)
    assert not co.state.ledger.events


class Replaying(Loopback):
    """Sends node 100 its unmask request a second time and keeps the answer."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.sa_unmask":
            self.second = super().__call__(kind, {100: contents[100]}, timeout)[100]
        return out


def test_a_client_answers_one_unmask_request_per_round():
    co, lb = loopback(config(SIGN_DP, federation={"rounds": 1}), cls=Replaying)
    co.run()
    assert lb.second.content is None and "no secure-sum state" in lb.second.error


def test_a_round_key_is_never_used_twice():
    co, lb = loopback(config(SIGN_DP, federation={"rounds": 2}))
    co.run()
    state = lb.states[100]
    assert state[fclient.NODE]["last_round"] == 2
    with pytest.raises(ProtocolError, match="already took part"):
        fclient._round_key(state, 2)


def test_fixed_point_secure_sum_matches_bit_for_bit():
    """FL-STD-DP rows are real: each client rounds its row to 2^-f stochastically. A seeded deployed
    client takes the draws the simulator's cohort-wide stream gives its row, so the sums agree."""
    require_row_contract()
    data = config({"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": 0.5}}, federation={"rounds": 1})
    sim, _ = simulate(data)
    co, _ = loopback(data)
    co.run()
    assert torch.equal(co.state.w, sim.w)


class Corrupting(Loopback):
    """Node 103's masked input loses its last byte on the way."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.sa_train" and 103 in out:
            rec = out[103].content[wire.SECAGG]
            rec["masked"] = rec["masked"][:-1]
        return out


def _one_round_with_a_faulty_node(cls) -> tuple[object, list[str]]:
    """FL-SIGN-DP, 4 clients, tolerance 1, one round over exchange class `cls`; the coordinator and its log."""
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 1, "clients_per_round": 4})
    co, _ = loopback(data, cls=cls)
    logs: list[str] = []
    co.log = logs.append
    co.run()
    return co, logs


def test_a_malformed_masked_input_is_rejected_and_the_round_goes_on_without_it():
    co, logs = _one_round_with_a_faulty_node(Corrupting)
    assert co.history[0]["answered"] == 3 and "aborted" not in co.history[0]
    assert any("rejected client 3" in line and "value bytes" in line for line in logs), logs


class CheatingShares(Loopback):
    """In round 1 node 101 sends well-formed but wrong Shamir shares in its unmask reply."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.sa_unmask" and 101 in out and not getattr(self, "done", False):
            self.done = True
            rec = out[101].content[wire.SECAGG]
            rec["self_shares"] = [bytes(36) for _ in rec["self_shares"]]
        return out


def test_a_client_with_wrong_shares_aborts_one_round_not_the_run():
    """Four clients (t = 2 of 3 shares): a wrong share is found but cannot be corrected, so round 1
    aborts cleanly — model unchanged, nothing charged — and round 2 runs as usual."""
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 2, "clients_per_round": 4})
    co, _ = loopback(data, cls=CheatingShares)
    w0 = co.state.w.clone()
    logs: list[str] = []
    co.log = logs.append
    co.run()
    assert "inconsistent shares" in co.history[0]["aborted"]
    assert "aborted" not in co.history[1] and co.history[1]["answered"] == 4
    assert not torch.equal(co.state.w, w0)
    assert len(co.state.ledger.events) == len(co.history[1:])  # only round 2 was charged


class LowOrderKey(Loopback):
    """Node 103 advertises a small-order masking key for round 1."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "query" and 103 in out:
            rec = out[103].content[wire.REPLY]
            rec["mask_pk"] = [bytes(32)] + list(rec["mask_pk"])[1:]
        return out


def _two_rounds_of_four(cls) -> tuple:
    """2 rounds of FL-SIGN-DP over 4 sites (one tolerated), `cls` the federation; the log's lines."""
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 2, "clients_per_round": 4})
    co, _ = loopback(data, cls=cls)
    logs: list[str] = []
    co.log = logs.append
    co.run()
    return co, logs


def test_a_small_order_key_excludes_its_client_from_that_round_only():
    co, logs = _two_rounds_of_four(LowOrderKey)
    assert co.history[0]["answered"] == 3 and co.history[1]["answered"] == 4
    assert any("rejected client 3" in line and "small order" in line for line in logs), logs


class OddShape(Loopback):
    """Node 103 claims a different row length d with its masked input."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.sa_train" and 103 in out:
            rec = out[103].content[wire.REPLY]
            rec["d"] = int(rec["d"]) + 1
        return out


def test_a_client_claiming_another_row_length_is_dropped_not_fatal():
    co, logs = _one_round_with_a_faulty_node(OddShape)
    assert co.history[0]["answered"] == 3 and "aborted" not in co.history[0]
    # its masked input does not have the length it claims: parsed at that length, it is refused
    assert any("rejected client 3" in line and "expected 1514 for 1211 values" in line for line in logs), logs


# ---- one round, every driver: the simulator and the Flower loopback agree bit for bit

# metrics only one driver has: Flower's serialized message sizes; what the simulator's in-process
# secure sum measures of its own simulated protocol; and what the client chain measures of the
# cohort's rows (clip fraction, noise shares), which deployed clients keep to themselves
FLOWER_ONLY = {"flower_up_bytes", "flower_down_bytes", "absent", "rejoined", "fed_sites", "fed_examples", "fed_accuracy",
               "fed_loss"}
SIMULATOR_ONLY = {"step_secagg_protocol_bytes", "step_secagg_dropped", "step_dp_clip_bound", "step_dp_clip_fraction",
                  "step_dp_noise_shares", "step_dp_share_std", "step_up_bits_per_value", "step_dp_count_share_std"}
# (Sub-FedAvg's step_sparsity and personal accuracies are computed from the masks its clients report)

SAME_ROUND = {
    "fl-std": {"name": "fl-std"},
    "fl-sign-dp": SIGN_DP,
    "fl-cs-dp": {"name": "fl-cs-dp", "options": {"sigma": 0.8, "clip": 0.5, "ratio": 0.25, "chunks": 2}},
    "fl-top-dp": {"name": "fl-top-dp", "options": {"sigma": 0.8, "clip": 0.5, "ratio": 0.25}},
    # adaptive clipping: C_t goes to the clients in the round plan, each count value inside the secure sum
    "adaptive-fl-std-dp": {"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": "adaptive", "clip_count_sigma": 1.0,
                                                            "clip_init": 0.05, "clip_lr": 0.5}},
    "adaptive-central-fl-std-dp": {"name": "fl-std-dp", "options": {
        "sigma": 0.8, "clip": "adaptive", "clip_count_sigma": 1.0, "noise": "central"}},
    # correlated noise: DP-FTRL's tree with distributed shares (each client continues its own earlier
    # shares), BandMF with central noise on a cyclic participation schema (issue 41)
    "tree-fl-std-dp": {"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": 0.5, "correlated": "tree"}},
    "bandmf-central-fl-std-dp": ({"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": 0.5, "correlated": "bandmf",
                                                                  "bands": 2, "noise": "central"}},
                                 {"data": {"n_clients": 4}, "federation": {"participation": "cyclic", "groups": 2,
                                                                           "clients_per_round": 2}}),
    "feddyn": {"name": "feddyn", "options": {"alpha": 0.1}},
    "fsvrg": {"name": "fsvrg", "options": {"h": 1.0, "batch_size": 64}},  # + the full-gradient exchange
    "sub-fedavg": {"name": "sub-fedavg", "options": {"sparsity": 0.5, "prune_rate": 0.3, "personal_eval": 50}},
}


def _comparable(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.endswith("seconds") and k not in FLOWER_ONLY | SIMULATOR_ONLY}


@pytest.mark.parametrize("name", sorted(SAME_ROUND))
def test_the_simulator_and_the_flower_loopback_run_the_same_round(name):
    require_row_contract()
    scheme, sections = SAME_ROUND[name] if isinstance(SAME_ROUND[name], tuple) else (SAME_ROUND[name], {})
    data = config(scheme, **{**sections, "data": {"public_size": 64, **sections.get("data", {})}})
    sim, sim_rounds = simulate(data)
    co, _ = loopback(data)
    co.run()
    assert torch.equal(co.state.w, sim.w)
    assert len(co.history) == len(sim_rounds) == 3
    for mine, ref in zip(co.history, sim_rounds):
        assert _comparable(mine) == _comparable(ref)  # accuracy, bytes, ε, the server steps' metrics
        keys, ref_keys = ({k for k in m if not k.endswith("seconds")} for m in (mine, ref))
        assert keys - ref_keys <= FLOWER_ONLY and ref_keys - keys <= SIMULATOR_ONLY
        assert "accuracy" in mine and 0 < mine["up_bytes"] < mine["flower_up_bytes"]  # + plan, record headers
        assert ("epsilon" in mine) == name.endswith("-dp")


def test_an_aborted_round_is_the_same_round_in_the_simulator_and_over_flower():
    """Two of four clients fail after masking, one is tolerated: the secure sum cannot complete.
    Both drivers release nothing (model unchanged, no privacy event) and report the same keys."""
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1, "drop_after_masking": 0.5}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 1, "clients_per_round": 4})
    sim, (ref,) = simulate(data)
    co, _ = loopback(data, cls=Recording, fail={"train.sa_train": {102, 103}})
    w0 = co.state.w.clone()
    co.run()
    (mine,) = co.history
    assert "aborted" in mine and "aborted" in ref
    assert torch.equal(co.state.w, w0) and torch.equal(sim.w, w0)
    assert not co.state.ledger.events and not sim.ledger.events
    assert mine["epsilon"] == ref["epsilon"] == 0 and mine["up_bytes"] == ref["up_bytes"] == 0
    keys, ref_keys = ({k for k in m if not k.endswith("seconds")} for m in (mine, ref))
    assert keys - ref_keys <= FLOWER_ONLY and ref_keys - keys <= SIMULATOR_ONLY


def test_a_secure_round_of_one_client_aborts_in_both_drivers():
    """A secure sum of one row would release that row: the simulator and Flower both abort it
    (over Flower the coordinator used to stop the run with a ConfigError)."""
    require_row_contract()
    data = config({"name": "fl-std-dp", "options": {"sigma": 0.8, "clip": 0.5}},
                  federation={"rounds": 1, "clients_per_round": 1})
    _, (ref,) = simulate(data)
    co, _ = loopback(data)
    co.run()
    (mine,) = co.history
    assert mine["aborted"] == ref["aborted"] and "≥ 2 clients" in ref["aborted"]
    assert mine["epsilon"] == ref["epsilon"] == 0 and not co.state.ledger.events


# ---- FSVRG's full gradient: the rows and the statistic are checked where they arrive

class TamperedGradients(Loopback):
    """Node 101 sends a float64 row of its local gradient; node 102 receives a full gradient
    changed by `tamper`. Keeps the training messages the coordinator sent."""

    def __init__(self, run_config, node_configs):
        super().__init__(run_config, node_configs)
        self.sent: dict[int, RecordDict] = {}

    def __call__(self, kind, contents, timeout, quorum=None):
        if kind == "train":
            self.sent = contents
            contents = {**contents, 102: _with_statistic(contents[102], _set(5, np.nan))}
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.statistic" and 101 in out:
            out[101].content[wire.STATISTIC] = wire.vector_record(out[101].content[wire.STATISTIC]["w"].numpy()
                                                                  .astype(np.float64))
        return out


def _with_statistic(content: RecordDict, change) -> RecordDict:
    """A copy of a training message with its round statistic changed (`change(array)`; None: left out)."""
    out = RecordDict({k: v for k, v in content.items() if k != wire.STATISTIC})
    g = change(content[wire.STATISTIC]["w"].numpy().copy())
    if g is not None:
        out[wire.STATISTIC] = ArrayRecord({"w": Array(np.ascontiguousarray(g))})
    return out


def _set(i: int, value: float):
    def change(g: np.ndarray) -> np.ndarray:
        g[i] = value
        return g
    return change


def test_fsvrg_clients_and_server_reject_malformed_gradients_in_one_line():
    """A malformed local gradient drops its client before the full gradient is formed; a client
    given a malformed full gradient refuses to train, naming the problem, and the round goes on."""
    co, lb = loopback(config(SAME_ROUND["fsvrg"], federation={"rounds": 1}), cls=TamperedGradients)
    logs: list[str] = []
    co.log = logs.append
    co.run()
    assert co.history[0]["answered"] == 1 and "aborted" not in co.history[0]
    assert any("rejected client 1" in line and "statistic: expected float32" in line for line in logs), logs
    assert any("node 102 failed: ProtocolError: statistic: 1 of its" in line and "NaN or infinite" in line
               for line in logs), logs
    n = co.state.flat.n
    good, node_cfg = lb.sent[100], lb.node_configs[100]
    for change, needle in [(_set(0, -np.inf), "1 of its"),
                           (lambda g: g.astype(np.float64), f"expected float32 [{n}], got float64 [{n}]"),
                           (lambda g: g[:-1], f"expected float32 [{n}], got float32 [{n - 1}]"),
                           (lambda g: None, "record 'statistic' is missing")]:
        with pytest.raises(ProtocolError, match=re.escape(needle)) as e:
            fclient.train_plain(_with_statistic(good, change), RecordDict(), node_cfg, lb.run_config)
        assert "\n" not in str(e.value)
    assert wire.PAYLOAD in fclient.train_plain(good, RecordDict(), node_cfg, lb.run_config)  # the message as sent


def test_sites_outside_the_next_cohort_evaluate_the_model_of_the_awaited_round():
    """4 sites, 3 a round (federated evaluation): the sites the next round's training message does
    not reach are asked in an exchange of their own, with the model of the round being evaluated,
    not the one the next round has released since."""
    from flower_helpers import held_out_counts

    require_row_contract()
    fixed = {"sampling_assumption": "poisson"}  # a fixed cohort of 3 of 4, accounted as Poisson
    data = config(SIGN_DP, data={"n_clients": 4}, federation={"rounds": 2, "clients_per_round": 3}, privacy=fixed)
    co, lb = loopback(data)
    co.evaluation = "federated"
    co.run()
    sim1, _ = simulate(config(SIGN_DP, data={"n_clients": 4}, federation={"rounds": 1, "clients_per_round": 3},
                              privacy=fixed))
    sim2, _ = simulate(data)
    assert torch.equal(co.state.w, sim2.w)
    assert "evaluate" in [k for k, _ in lb.calls[:-1]]  # round 1's fourth site, during round 2
    for m, w in zip(co.history, (sim1.w, sim2.w)):
        want = held_out_counts(data, w)
        assert m["fed_sites"] == 4 and m["fed_examples"] == want["n"]
        assert m["fed_accuracy"] == want["correct"] / want["n"]
        assert m["fed_loss"] == pytest.approx(want["loss_sum"] / want["n"], rel=1e-9)  # sites' sums: other order


class BadNextError(Loopback):
    """Node 103 answers round 1's unmask message with a next-round error record that has no text."""

    def __call__(self, kind, contents, timeout, quorum=None):
        out = super().__call__(kind, contents, timeout, quorum)
        if kind == "train.sa_unmask" and 103 in out and out[103].content is not None:
            from flwr.app import ConfigRecord

            out[103].content[wire.NEXT_ERROR] = ConfigRecord({"x": 1})
        return out


def test_a_malformed_next_round_error_is_logged_not_fatal():
    co, logs = _two_rounds_of_four(BadNextError)
    assert [m["answered"] for m in co.history] == [4, 4]
    assert any("client 3 cannot join: 'None'" in line for line in logs), logs


def test_a_round_whose_keys_too_few_shared_aborts_without_sharing_them_twice():
    """tolerate = 0: node 102 is lost as round 1's unmask message goes out (it carries round 2's key
    sharing). Round 1 completes from the others' shares; round 2's keys reached too few: round 2
    aborts at once (its keys are used once: no second sharing), round 3 shares afresh and aborts
    for lack of the lost site."""
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 3, "clients_per_round": 3})
    co, lb = loopback(data)
    lb.before = lambda kind, calls: lb.kill(102) if kind == "train.sa_unmask" else None
    co.run()
    assert "aborted" not in co.history[0]
    assert "too few clients shared its keys with round 1's unmasking" in co.history[1]["aborted"]
    kinds = [k for k, _ in lb.calls if k != "evaluate"]  # (round 1's evaluation: round 2 sent nothing)
    assert kinds[:5] == ["query", "train.sa_keys", "train.sa_train", "train.sa_unmask", "train.sa_keys"]
    assert kinds.count("train.sa_keys") == 2  # rounds 1 and 3, never round 2


def test_a_lost_site_is_not_asked_again_to_evaluate():
    """A site lost during round 2's training message is not sent an evaluation exchange of its own
    (over Flower it would be waited for): the round's federated metrics count the sites that answered."""
    require_row_contract()
    scheme = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "tolerate": 1}}
    data = config(scheme, data={"n_clients": 4}, federation={"rounds": 3, "clients_per_round": 4})
    co, lb = loopback(data)
    state = {}

    def before(kind, calls):
        if kind == "train.sa_train" and sum(k == "train.sa_train" for k, _ in lb.calls) == 2:
            lb.kill(103)
            state["at"] = calls

    lb.before = before
    co.run()
    after = lb.calls[state["at"]:]
    assert not any(kind == "evaluate" and 103 in nodes for kind, nodes in after), after
    assert [m["fed_sites"] for m in co.history] == [3, 3, 3] and [m["answered"] for m in co.history] == [4, 3, 3]
