"""The site worker (`dpfl.flower.worker`): a training message forwarded to it gets the reply and
leaves the node state the in-process handler gives; a handler's error comes back with its type;
the socket directory must be this user's alone."""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
import time
from pathlib import Path

import pytest
from flower_helpers import SIGN_DP, config, require_row_contract
from test_client_startup import Capturing

from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower import worker
from dpfl.flower.client import HANDLERS
from dpfl.flower.local import _cmdline


@pytest.fixture
def sockets(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    for pid in [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]:
        if "dpfl.flower.site" in _cmdline(pid) and str(tmp_path) in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)


def _messages() -> dict[str, tuple]:
    from flower_helpers import loopback

    co, lb = loopback(config(SIGN_DP, federation={"rounds": 1, "clients_per_round": 3}), cls=Capturing)
    co.run()
    return {k: pickle.loads(v) for k, v in lb.seen.items()}


def test_a_message_in_the_worker_equals_the_message_in_process(sockets):
    require_row_contract()
    seen = _messages()
    old = worker.socket_dir() / "gone.lock"  # a gone worker's: a new worker's start sweeps it
    old.write_text("")
    os.utime(old, (1.0, 1.0))
    after = {}
    for kind in ("query", "train.sa_train", "evaluate"):
        _, content, state, nc, rc = seen[kind]
        here, there = pickle.loads(pickle.dumps(state)), pickle.loads(pickle.dumps(state))
        after[kind] = there
        want = HANDLERS[kind](content, here, nc, rc)
        got = worker.call(kind, content, there, nc, rc, run_id=7, node_id=100)
        assert set(got) == set(want) and set(there) == set(here)
        if kind == "train.sa_train":  # the masked input and the round's state (seeded: the same bytes)
            assert there["dpfl_secagg"] == here["dpfl_secagg"] and there["dpfl_secagg"]["phase"] == "masked"
            assert got["secagg"] == want["secagg"]
        if kind == "evaluate":
            assert got["reply"] == want["reply"]
    assert not old.exists()
    _, content, state, nc, rc = seen["train.sa_train"]
    with pytest.raises(ProtocolError, match="this client is after 'masked'"):  # the state came back: phase done
        worker.call("train.sa_train", content, after["train.sa_train"], nc, rc, run_id=7, node_id=100)
    with pytest.raises(ConfigError, match="partition-id must be an integer"):
        worker.call("query", seen["query"][1], state, {"partition-id": 9}, rc, run_id=7, node_id=100)


def test_a_socket_directory_others_can_open_is_refused(sockets):
    d = sockets / f"dpfl-{os.getuid()}"
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    with pytest.raises(ConfigError, match="must belong to this user with mode 0700"):
        worker.socket_path(1, 2)


def test_the_old_files_of_gone_workers_are_swept_and_nothing_else(tmp_path):
    now = 1_000_000_000.0
    day = 86400.0
    files = {"a.lock": 2 * day, "a.log": 2 * day, "b.log": 8 * day, "c.lock": 2 * day, "c.log": 8 * day,
             "c.sock": 8 * day, "d.lock": 0.5 * day, "e.txt": 30 * day}
    for name, age in files.items():
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (now - age, now - age))
    os.symlink(tmp_path / "e.txt", tmp_path / "f.lock")
    os.utime(tmp_path / "f.lock", (now - 30 * day, now - 30 * day), follow_symlinks=False)
    assert worker.sweep(tmp_path, now) == 2  # a.lock (over a day), b.log (over a week); a.log is kept a week
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["a.log", "c.lock", "c.log", "c.sock", "d.lock", "e.txt", "f.lock"], left


def test_an_old_socket_nobody_answers_on_goes_with_its_files_and_a_served_one_stays(tmp_path):
    import socket

    now = time.time() + 2 * 86400.0
    dead, live = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "a.sock"))
    dead.close()  # a killed worker's: the file stays, nobody listens
    live.bind(str(tmp_path / "b.sock"))
    live.listen(1)
    try:
        for name in ("a.lock", "b.lock"):
            (tmp_path / name).write_text("")
        assert worker.sweep(tmp_path, now) == 2  # a.sock, then a.lock
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b.lock", "b.sock"]
    finally:
        live.close()
