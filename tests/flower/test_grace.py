"""When the ServerApp stops waiting: replies are collected until the quorum is met, then the rest
get a grace. The quorum counts replies with content only, and the unmask exchange (which also
carries the next round's key sharing) waits for each of its two groups apart: the next cohort's
answers must not end the wait for the survivors' unmask shares. Time is virtual here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from flower_helpers import SIGN_DP, config, loopback
from flwr.app import ConfigRecord, RecordDict

from dpfl.flower import server
from dpfl.flower.coordinator import quorum_open
from dpfl.flower.loopback import Loopback


class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t

    def sleep(self, s):
        self.t += s


class FakeGrid:
    """Each node answers at its own (virtual) time; `errors` answer with an error, `unavailable`
    get the SuperLink's "node unavailable" error (from node 1)."""

    def __init__(self, clock, at, errors=(), unavailable=()):
        self.clock, self.at, self.errors, self.sent = clock, at, set(errors), {}
        self.unavailable = set(unavailable)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            mid = f"m{m.metadata.dst_node_id}"
            self.sent[mid] = m.metadata.dst_node_id
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        out = []
        for mid in ids:
            node = self.sent[mid]
            if self.at.get(node, float("inf")) <= self.clock.t:
                err = node in self.errors | self.unavailable
                src = 1 if node in self.unavailable else node
                out.append(SimpleNamespace(
                    metadata=SimpleNamespace(reply_to_message_id=mid, src_node_id=src), has_error=lambda e=err: e,
                    error=SimpleNamespace(reason="boom", code=0),
                    content=RecordDict({"x": ConfigRecord({"v": node})})))
        return out


def exchange(monkeypatch, at, quorum, errors=(), timeout=300.0):
    clock = Clock()
    monkeypatch.setattr(server, "time", clock)
    monkeypatch.setattr(server, "content_nbytes", lambda m: 0)
    monkeypatch.setattr(server, "Message", lambda content, dst_node_id, message_type: SimpleNamespace(
        content=content, metadata=SimpleNamespace(dst_node_id=dst_node_id)))
    ex = server.GridExchange(FakeGrid(clock, at, errors), poll=0.5)
    out = ex("train.sa_unmask", {n: RecordDict({"x": ConfigRecord({"v": n})}) for n in at}, timeout, quorum)
    return {n: rep.content is not None for n, rep in out.items()}, clock.t


def test_quorum_open_counts_each_group_apart():
    a, b = frozenset({1, 2, 3}), frozenset({3, 4, 5})
    assert quorum_open(((a, 2), (b, 2)), [1, 2, 3, 4, 5], answered=[4, 5], pending=[1, 2, 3])
    assert quorum_open(((a, 2), (b, 2)), [1, 2, 3, 4, 5], answered=[1, 4, 5], pending=[2, 3])
    assert not quorum_open(((a, 2), (b, 2)), [1, 2, 3, 4, 5], answered=[1, 3, 5], pending=[2, 4])
    # errors made k answers impossible: replies of any kind count (as all did before)
    assert not quorum_open(((a, 2),), [1, 2, 3], answered=[], pending=[1])
    assert quorum_open(((a, 3),), [1, 2, 3], answered=[], pending=[1])
    assert quorum_open(2, [1, 2, 3], answered=[1], pending=[2, 3])
    assert not quorum_open(2, [1, 2, 3], answered=[1, 2], pending=[3])


def test_the_next_cohorts_answers_do_not_start_the_grace_for_the_unmask_shares(monkeypatch):
    # nodes 4, 5 carry only the next round's keys and answer at once; 1, 2 unmask, slowly (60 s)
    at = {1: 60.0, 2: 61.0, 3: float("inf"), 4: 1.0, 5: 1.0}
    grouped = ((frozenset({1, 2, 3}), 2), (frozenset({3, 4, 5}), 2))
    got, t = exchange(monkeypatch, at, grouped)
    assert got == {1: True, 2: True, 4: True, 5: True} and t >= 61.0
    # one count over all the nodes sent to (the old rule): the grace starts after 4 and 5, and the
    # unmask shares are cut off
    got, t = exchange(monkeypatch, at, 2)
    assert 1 not in got and 2 not in got and t < 60.0


def test_errors_do_not_meet_the_quorum(monkeypatch):
    at = {1: 1.0, 2: 1.0, 3: 30.0}
    got, t = exchange(monkeypatch, at, 2, errors={1})
    assert got == {1: False, 2: True, 3: True} and t >= 30.0
    # a quorum that can no longer be met: replies of any kind count, as fewer answers are still of use
    got, t = exchange(monkeypatch, {1: 1.0, 2: 1.0, 3: float("inf")}, 2, errors={1, 2})
    assert got == {1: False, 2: False} and t < 20.0  # two replies: the grace, not the timeout
    got, t = exchange(monkeypatch, {1: 1.0, 2: 1.0, 3: 30.0, 4: 30.0, 5: 30.0}, 4, errors={1, 2})
    assert got == {1: False, 2: False, 3: True, 4: True, 5: True}  # two errors do not cut the three off


def test_errors_that_come_after_the_exchange_are_found_later(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(server, "time", clock)
    monkeypatch.setattr(server, "content_nbytes", lambda m: 0)
    monkeypatch.setattr(server, "Message", lambda content, dst_node_id, message_type: SimpleNamespace(
        content=content, metadata=SimpleNamespace(dst_node_id=dst_node_id)))
    grid = FakeGrid(clock, {1: 1.0, 2: 1.0, 3: 100.0, 4: 100.0, 5: 100.0, 6: float("inf")}, errors={3},
                    unavailable={4})
    ex = server.GridExchange(grid, poll=0.5)
    out = ex("train.sa_train", {n: RecordDict({"x": ConfigRecord({"v": n})}) for n in range(1, 7)}, 300.0, 2)
    assert set(out) == {1, 2} and clock.t < 20.0
    assert ex.late_errors() == {}  # nothing has come yet
    clock.t = 200.0
    # 3's own error counts; 4's is the SuperLink's, 5 answered with content, 6 has not answered
    assert ex.late_errors() == {3: "boom (Flower error code 0)"}
    assert sorted(ex.late.values()) == [6] and ex.late_errors() == {}


class Recording(Loopback):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.unmask = []

    def __call__(self, kind, contents, timeout, quorum=None):
        if kind == "train.sa_unmask":
            self.unmask.append((set(contents), quorum))
        return super().__call__(kind, contents, timeout, quorum)


def test_the_coordinator_asks_for_the_unmask_and_the_next_keys_apart():
    # 5 sites, 3 a round: the next cohort differs from the survivors asked to unmask
    co, lb = loopback(config(SIGN_DP, data={"n_clients": 5}, federation={"rounds": 3, "clients_per_round": 3},
                             privacy={"sampling_assumption": "poisson"}),
                      cls=Recording)
    co.run()
    assert len(lb.unmask) == 3
    for r, (sent, quorum) in enumerate(lb.unmask, start=1):
        groups = [set(g) for g, _ in quorum]
        assert len(quorum) == (2 if r < 3 else 1)  # the last round carries no next keys
        assert set().union(*groups) == sent and all(1 <= k <= len(g) for g, k in quorum)
    assert any(len(quorum) == 2 and set(quorum[0][0]) != set(quorum[1][0]) for _, quorum in lb.unmask)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
