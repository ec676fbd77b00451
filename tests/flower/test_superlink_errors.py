"""A SuperLink that answers HTTP 500 for a while (its SQLite database locked by another process, past
its 5 s busy timeout): Flower 1.41's own SuperNode gives up on the first such answer (its loop ends,
the node is deactivated) and its process stays up, out of the federation for good. dpfl-supernode
retries, and stays in; one told to give up (`--max-retries 0`) exits with 75 instead of hanging."""

from __future__ import annotations

import os
import re
import sqlite3
import time

import pytest

from dpfl.flower.local import LocalFederation, free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="the local federation runs on Linux")]


def _online(db) -> list[int]:
    """The ids of the nodes the SuperLink counts online (as the SuperNodes print them)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("select node_id, status, online_until - strftime('%s', 'now') from node").fetchall()
    finally:
        con.close()
    return sorted(node % (1 << 64) for node, status, left in rows if status == "online" and left > 0)


def _up(log, deadline: float) -> int:
    """The node id the SuperNode logging to `log` printed once activated."""
    while b"SuperNode ID:" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    found = re.search(r"SuperNode ID: (\d+)", log.read_text(errors="replace"))
    assert found, log.read_text(errors="replace")[-2000:]
    return int(found.group(1))


def test_a_site_rides_out_a_superlink_answering_500_and_one_that_gives_up_exits(tmp_path):
    with LocalFederation(tmp_path / "fed", 1, log=lambda s: None) as fed:
        db = fed.dir / "superlink.db"
        log = fed.dir / "logs" / "supernode-0.log"
        deadline = time.monotonic() + 60
        site = _up(log, deadline)
        quitter = fed._spawn([*fed.supernode_command(1, free_port()), "--max-retries", "0"], "supernode-1")
        log1 = fed.dir / "logs" / "supernode-1.log"
        both = sorted([site, _up(log1, deadline)])
        while _online(db) != both and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _online(db) == both, (_online(db), both)
        lock = sqlite3.connect(db, timeout=30, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # every write of the SuperLink fails after its 5 s busy timeout
        time.sleep(12)
        lock.execute("ROLLBACK")
        lock.close()
        quitter.wait(timeout=60)
        text, quit_text = log.read_text(errors="replace"), log1.read_text(errors="replace")
        assert quitter.returncode == 75 and "500 Internal Server Error" in quit_text, quit_text[-3000:]
        assert "exiting with code 75, to be started again" in quit_text
        assert fed.nodes[0].poll() is None and "Connection attempt failed, retrying" in text, text[-3000:]
        assert "500 Internal Server Error" not in text and "left the federation" not in text, text[-3000:]
        deadline = time.monotonic() + 30  # its next heartbeat: online again; the other's last one expired
        while _online(db) != [site] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _online(db) == [site]
