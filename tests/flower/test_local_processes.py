"""The local federation stops what a SuperNode killed from outside leaves running (its SuperExec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpfl.flower.local import LocalFederation, _alive, descendants, session_members, start_time

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process sessions are read from Linux /proc")

# A stand-in SuperNode: starts a child in its own session (as Flower's SuperNode starts its SuperExec),
# prints the child's pid, then waits.
NODE = ("import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print(c.pid, flush=True)\n"
        "print('serving', flush=True)\n"
        "time.sleep(300)\n")


def _node(fed: LocalFederation, i: int) -> tuple[subprocess.Popen, int]:
    p = fed._spawn([sys.executable, "-c", NODE], f"supernode-{i}")
    fed.nodes[i] = p
    log = fed.dir / "logs" / f"supernode-{i}.log"
    deadline = time.monotonic() + 60
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    return p, int(log.read_text().split()[0])


def test_stop_ends_what_a_supernode_killed_from_outside_left(tmp_path):
    fed = LocalFederation(tmp_path, 1, log=lambda s: None)
    try:
        p, child = _node(fed, 0)
        os.kill(p.pid, signal.SIGKILL)  # by someone else: the federation has not waited for it yet
        time.sleep(0.3)
        assert _alive(child)
    finally:
        fed.stop()
    assert not _alive(child)


def test_a_node_killed_by_kill_node_takes_its_session_along_and_is_not_reported(tmp_path):
    lines: list[str] = []
    fed = LocalFederation(tmp_path, 1, log=lines.append)
    try:
        p, child = _node(fed, 0)
        fed.kill_node(0)
        assert not _alive(child) and p.poll() == -signal.SIGKILL
        fed.check_nodes()
        assert lines == []
    finally:
        fed.stop()


def test_a_node_found_dead_during_a_run_is_reported_once_and_its_leftovers_stopped(tmp_path):
    lines: list[str] = []
    fed = LocalFederation(tmp_path, 2, log=lines.append)
    try:
        p, child = _node(fed, 1)
        q, other = _node(fed, 0)
        fed.check_nodes()
        assert lines == []
        os.kill(p.pid, signal.SIGKILL)
        p.wait()  # reaped or not, its child stays in its session
        fed.check_nodes()
        fed.check_nodes()
        assert len(lines) == 1 and lines[0].startswith("the SuperNode of client 1 exited with code -9; "
                                                       "stopped 1 process it left running: serving (see "), lines
        assert not _alive(child) and _alive(other) and q.poll() is None
    finally:
        fed.stop()
    assert not _alive(other)


def test_a_leaders_pid_held_by_a_later_process_is_not_its_session(tmp_path):
    fed = LocalFederation(tmp_path, 1, log=lambda s: None)
    try:
        p, child = _node(fed, 0)
        t = start_time(p.pid)
        assert sorted(session_members({p.pid: t})) == sorted([p.pid, child])
        assert session_members({p.pid: t + 1}) == []  # another process's start time: not ours
    finally:
        fed.stop()


def test_a_process_whose_name_is_not_utf8_does_not_stop_the_scan():
    name = ("import ctypes, time\n"
            "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'bad\\xff\\xfename'), 0, 0, 0)\n"
            "print('named', flush=True)\n"
            "time.sleep(300)\n")
    p = subprocess.Popen([sys.executable, "-c", name], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"named\n"
        assert b"\xff" in Path(f"/proc/{p.pid}/stat").read_bytes()
        assert p.pid in descendants([os.getpid()])
    finally:
        p.kill()
        p.wait()


def test_ports_are_distinct_free_and_outside_the_kernels_range_for_outgoing_connections():
    """A port from bind to port 0 can be taken by an outgoing connection before the SuperNode binds it
    (its Runtime API then fails to start: exit code 1, as a CI run saw)."""
    import socket

    from dpfl.flower.local import _ephemeral, free_port

    low, high = _ephemeral()
    if low - 10000 < 1000 and 65535 - high < 1000:
        pytest.skip(f"the ephemeral range {low}-{high} leaves no room for other ports")
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not any(low <= p <= high for p in ports) and min(ports) >= 10000, (low, high)  # nor Flower's 8000, 9091-
    for p in ports[:20]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_component_that_exited_before_the_run_is_named_with_its_last_log_line(tmp_path):
    from dpfl.flower.local import FederationError

    fed = LocalFederation(tmp_path, 1, log=lambda s: None)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "supernode-0.log").write_text("an earlier start's last line\n")
    try:
        p = fed._spawn([sys.executable, "-c", "import sys; print('starting'); sys.exit('dpfl-supernode: no good')"],
                       "supernode-0")
        fed.nodes[0] = p
        p.wait(timeout=60)
        with pytest.raises(FederationError, match=r"exited with code 1 before the run: dpfl-supernode: no good "
                                                  r"\(see .*supernode-0\.log\)"):
            fed.run(tmp_path / "app")
        q = fed._spawn([sys.executable, "-c", "pass"], "supernode-0")  # prints nothing: no line of the earlier one
        fed.nodes[0] = q
        q.wait(timeout=60)
        with pytest.raises(FederationError, match=r"exited with code 0 before the run$"):
            fed.run(tmp_path / "app")
    finally:
        fed.stop()
