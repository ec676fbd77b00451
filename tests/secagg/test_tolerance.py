"""A client's own share of its self-mask seed counts (issue 38): l lost clients are survivable iff
degree + 1 − l ≥ t, so `tolerate = l` holds at small n; the threshold rule 2t > degree + 1 that
keeps it safe; impossible (n, l, t) refused with one line when the run or the round is built."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import Seeds
from dpfl.schemes.base import RoundContext
from dpfl.schemes.dp import ClipStep, GaussianNoiseStep
from dpfl.schemes.secure_sum import SecAggTransport, SecureSum
from dpfl.secagg import graph, shamir
from dpfl.secagg.protocol import Client, RoundAborted, RoundConfig, Server, UnmaskRequest
from dpfl.secagg.simulate import exchange_keys, make_config, secure_sum


def _rows(k, d, bits, seed=0):
    return np.random.default_rng(seed).integers(0, 2**bits, size=(k, d), dtype=np.uint64).astype(np.uint32)


def _plain(rows, keep, bits):
    return rows[sorted(keep)].astype(np.uint64).sum(axis=0) % (1 << bits)


def test_threshold_rule_and_tolerance():
    assert [graph.default_threshold(d) for d in range(1, 10)] == [2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert [graph.max_tolerated(d, graph.default_threshold(d)) for d in range(1, 10)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    for d in range(1, 40):  # even degree: t as before; odd: one more, and never fewer dropouts tolerated
        t_old = d // 2 + 1
        assert graph.min_threshold(d) == t_old + d % 2
        assert graph.max_tolerated(d, graph.min_threshold(d)) >= d - t_old  # the old count: d − l ≥ t_old
    with pytest.raises(ConfigError, match=r"threshold t must be an integer in \[1, 4\] for degree 3"):
        graph.max_tolerated(3, 5)
    full = {u: tuple(v for v in range(4) if v != u) for u in range(4)}  # degree 3
    with pytest.raises(ConfigError, match=r"must be in \[3, 4\]"):
        RoundConfig(0, 4, 8, 22, full, 2, 2)  # t = 2 was allowed before: 2t ≤ degree + 1 now
    RoundConfig(0, 4, 8, 22, full, 4, 4)  # t = degree + 1: safe, tolerates no loss
    pair = {0: (1,), 1: (0,)}
    assert RoundConfig(0, 2, 8, 22, pair, 2, 2).threshold == 2 == make_config(2, 8, 22).threshold


@pytest.mark.parametrize("lost", [0, 1, 2])
def test_three_clients_survive_one_lost_client(lost):
    """n = 3, complete graph, t = 2, l = 1: before, each survivor held one neighbour's share of its
    seed (< t) and every such round aborted; its own share makes two."""
    k, d, bits = 3, 300, 22
    rows = _rows(k, d, bits, seed=lost)
    total, st = secure_sum(rows, bits, drop_after_masking=[lost], rng_seed=lost)
    assert st["threshold"] == 2 and st["min_survivors"] == 2
    assert np.array_equal(total, _plain(rows, set(range(k)) - {lost}, bits))


def test_three_clients_hand_driven_round_with_a_client_lost_after_sharing_keys():
    k, d, bits = 3, 40, 22
    rows = _rows(k, d, bits, seed=5)
    cfg = make_config(k, d, bits, rng_seed=5)
    clients = [Client(u, cfg, Seeds(5).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    for c in clients[:2]:  # client 2 shared its keys, then is lost
        srv.receive(c.masked_input(rows[c.id], inbox[c.id]))
    request = srv.close_masked()
    assert request.survivors == {0, 1}
    answers = [clients[u].unmask(request) for u in (0, 1)]
    for a in answers:  # its own share of its seed and the other survivor's; client 2's mask key
        assert set(a.self_mask_shares) == {0, 1} and set(a.key_shares) == {2}
        srv.receive(a)
    assert np.array_equal(srv.finish(), _plain(rows, {0, 1}, bits))
    assert not srv.rejected and not srv.cheaters


def test_the_server_accepts_a_survivors_own_share_and_no_foreign_one():
    k, d, bits = 8, 8, 22
    cfg = make_config(k, d, bits, neighbours=2, rng_seed=3)  # SecAgg+ ring: degree 2, t = 2
    clients = [Client(u, cfg, Seeds(3).crypto("client", u)) for u in range(k)]
    srv = Server(cfg)
    inbox = exchange_keys(srv, clients)
    rows = _rows(k, d, bits, seed=3)
    for c in clients:
        srv.receive(c.masked_input(rows[c.id], inbox[c.id]))
    request = srv.close_masked()
    answers = {c.id: c.unmask(request) for c in clients}
    assert all(set(a.self_mask_shares) == {u, *cfg.neighbours[u]} for u, a in answers.items())
    stranger = next(v for v in range(1, k) if v not in cfg.neighbours[0])
    forged = dataclasses.replace(answers[0], self_mask_shares={**answers[0].self_mask_shares,
                                                               stranger: answers[0].self_mask_shares[0]})
    with pytest.raises(ProtocolError, match=rf"client 0: self-mask shares for non-surviving or non-neighbour "
                                            rf"clients \[{stranger}\]"):
        srv.receive(forged)
    for a in answers.values():
        srv.receive(a)
    assert np.array_equal(srv.finish(), _plain(rows, range(k), bits))


def _ctx(k, d):
    return RoundContext(round=1, n_params=d, cohort=np.arange(k), n_selected=k, weights=torch.ones(k),
                        seeds=Seeds(0), device=torch.device("cpu"), global_params=torch.zeros(d))


def _one_line(excinfo, *words):
    msg = str(excinfo.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


@pytest.mark.parametrize("n,l,most", [(3, 2, 1), (2, 1, 0), (4, 2, 1), (8, 4, 3)])
def test_an_impossible_tolerance_is_refused_in_one_line(n, l, most):
    t = graph.default_threshold(n - 1)
    with pytest.raises(ConfigError) as e:  # the round: min_survivors = n − l
        make_config(n, 4, 22, min_survivors=n - l)
    _one_line(e, f"n = {n}", f"l = {l}", f"t = {t}", f"at most l = {most}")
    with pytest.raises(ConfigError) as e:  # the transport, built for a known cohort size
        SecAggTransport("int", bits=12, max_dropouts=l, cohort=n)
    _one_line(e, f"n = {n}", f"l = {l}", f"t = {t}", f"at most l = {most}")
    noise = GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, tolerate=l)
    with pytest.raises(ConfigError) as e:
        SecureSum(noise, cohort=n)
    _one_line(e, f"n = {n}", f"l = {l}", f"t = {t}", f"at most l = {most}")
    late = SecureSum(noise)  # no cohort size at build: the round of k clients aborts, releasing nothing
    with pytest.raises(RoundAborted, match=f"cannot tolerate l = {l} lost clients: at most l = {most}"):
        late.round_transport(n, 4)
    with pytest.raises(RoundAborted, match=f"cannot tolerate l = {l} lost clients: at most l = {most}"):
        SecAggTransport("int", bits=12, max_dropouts=l).transmit(torch.zeros(n, 4, dtype=torch.int64), _ctx(n, 4))
    SecAggTransport("int", bits=12, max_dropouts=most, cohort=n)  # the largest l is accepted
    SecureSum(GaussianNoiseStep(1.0, ClipStep(1.0), q=0.1, tolerate=most), cohort=n).round_transport(n, 4)
    make_config(n, 4, 22, min_survivors=n - most)


def test_a_sparse_graph_tolerates_degree_plus_one_minus_t():
    """SecAgg+ degree 4, t = 3: any 2 lost clients are survivable, 3 all neighbours of one are not."""
    SecAggTransport("int", bits=12, neighbours=4, max_dropouts=2, cohort=20)
    with pytest.raises(ConfigError, match=r"n = 20 clients \(degree 4\) at threshold t = 3 cannot tolerate "
                                          r"l = 3 lost clients: at most l = 2"):
        SecAggTransport("int", bits=12, neighbours=4, max_dropouts=3, cohort=20)


def test_two_clients_sum_and_tolerate_no_loss():
    k, d, bits = 2, 50, 22
    rows = _rows(k, d, bits, seed=2)
    total, st = secure_sum(rows, bits, rng_seed=2)
    assert st["threshold"] == 2 and np.array_equal(total, _plain(rows, range(k), bits))
    with pytest.raises(RoundAborted, match="1 clients sent masked inputs, at least 2"):
        secure_sum(rows, bits, rng_seed=2, drop_after_masking=[1])


@pytest.mark.parametrize("k", [4, 5])
def test_no_split_of_the_survivor_lists_gives_both_secrets_of_a_client(k):
    """Every split of client 0's neighbours into those told "0 survived" (they reveal shares of b_0,
    and client 0 its own) and those told "0 was lost" (shares of s_0): one side is short of t.
    At k = 4 (degree 3) the old threshold t = 2 would not do with the own share: 1 + 1 and 2."""
    d, bits = 8, 22
    for told_alive in itertools.chain.from_iterable(itertools.combinations(range(1, k), r) for r in range(k)):
        cfg = make_config(k, d, bits, rng_seed=k)
        clients = [Client(u, cfg, Seeds(k).crypto("client", u)) for u in range(k)]
        inbox = exchange_keys(Server(cfg), clients)
        for c in clients:
            c.masked_input(np.zeros(d, np.uint32), inbox[c.id])
        got_b, got_s = {}, {}
        for u in range(k):
            listed = frozenset(range(k)) if u == 0 or u in told_alive else frozenset(range(1, k))
            a = clients[u].unmask(UnmaskRequest(cfg.round_id, listed))
            got_b.update({u + 1: a.self_mask_shares[0]} if 0 in a.self_mask_shares else {})
            got_s.update({u + 1: a.key_shares[0]} if 0 in a.key_shares else {})
        assert len(got_b) == len(told_alive) + 1 and len(got_s) == k - 1 - len(told_alive)
        assert min(len(got_b), len(got_s)) < cfg.threshold
        short = got_b if len(got_b) < cfg.threshold else got_s
        with pytest.raises(ProtocolError):
            shamir.reconstruct(short, cfg.threshold)
