"""A SuperLink that answers HTTP 500 for a while (its SQLite database locked by another process, past
its 5 s busy timeout): Flower 1.41's own SuperNode gives up on the first such answer (its loop ends,
the node is deactivated) and its process stays up, out of the federation for good. dpfl-supernode
retries, and stays in; one told to give up (`--max-retries 0`) exits with 75 instead of hanging."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from dpfl.flower.local import LocalFederation, free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local federation runs on Linux")]


def _online(db) -> int:
    """How many nodes the SuperLink counts online."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("select status, online_until - strftime('%s', 'now') from node").fetchall()
    finally:
        con.close()
    return sum(status == "online" and left > 0 for status, left in rows)


def _up(log, deadline: float) -> str:
    while b"SuperNode ID:" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    text = log.read_text(errors="replace")
    assert "SuperNode ID:" in text, text[-2000:]
    return text


def test_a_site_rides_out_a_superlink_answering_500_and_one_that_gives_up_exits(tmp_path):
    with LocalFederation(tmp_path / "fed", 1, log=lambda s: None) as fed:
        db = fed.dir / "superlink.db"
        log = fed.dir / "logs" / "supernode-0.log"
        deadline = time.monotonic() + 60
        _up(log, deadline)
        quitter = fed._spawn([*fed.supernode_command(1, free_port()), "--max-retries", "0"], "supernode-1")
        log1 = fed.dir / "logs" / "supernode-1.log"
        _up(log1, deadline)
        assert _online(db) == 2
        lock = sqlite3.connect(db, timeout=30, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # every write of the SuperLink fails after its 5 s busy timeout
        time.sleep(12)
        lock.execute("ROLLBACK")
        lock.close()
        quitter.wait(timeout=60)
        text = log.read_text(errors="replace")
        assert "Connection attempt failed, retrying" in text  # it got the 500s
        assert fed.nodes[0].poll() is None and "500 Internal Server Error" not in text, text[-3000:]
        deadline = time.monotonic() + 30  # its next heartbeat: online again
        while _online(db) != 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _online(db) == 1  # it, not the one that gave up
        assert quitter.returncode == 75
        assert "exiting with code 75" in log1.read_text(errors="replace")
