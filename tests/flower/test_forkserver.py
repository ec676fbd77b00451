"""dpfl's fork server (dpfl.flower.forkserver) and the `flwr-clientapp` script that uses it: the fork
runs with the script's arguments, directory, environment and streams, reports its exit status, gets
the script's signals, ends when the script is gone; a bad request is refused and the server goes on."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.flower import forkserver, launcher
from dpfl.flower.local import _cmdline, descendants

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server is Linux only (SO_PEERCRED, fork)")

# a stand-in for Flower's flwr_clientapp: what the fork sees, then an exit status
PROBE_MAIN = '''
import os, signal, sys, time
def main():
    def term(n, _):
        open(sys.argv[2] + ".tmp", "w").write("TERM")
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
        print("TERM", flush=True)
        sys.exit(3)
    if sys.argv[1:2] == ["sleep"]:
        signal.signal(signal.SIGTERM, term)
    print("ARGV", sys.argv[1:], "CWD", os.getcwd(), "X", os.environ.get("DPFL_TEST_X"), flush=True)
    if sys.argv[1:2] == ["sleep"]:
        for _ in range(600):  # short sleeps: a signal caught just before a sleep starts is not lost in it
            time.sleep(0.1)
    if sys.argv[1:2] == ["osexit"]:  # as Flower's exit when its graceful exit times out: no report
        os._exit(int(sys.argv[2]))
    if sys.argv[1:2] == ["selfkill"]:
        os.kill(os.getpid(), int(sys.argv[2]))
        time.sleep(60)
    if "--parent-pid" in sys.argv:  # as Flower's run_clientapp: a monitor raises SIGINT in its own thread
        import threading
        def monitor(ppid=int(sys.argv[sys.argv.index("--parent-pid") + 1])):
            while True:
                time.sleep(0.2)
                try:
                    os.kill(ppid, 0)
                except ProcessLookupError:
                    signal.raise_signal(signal.SIGINT)
                    break
        threading.Thread(target=monitor, daemon=True).start()
    if sys.argv[1:2] in (["block"], ["deaf"]):
        import threading
        if sys.argv[1] == "deaf":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Event().wait()  # no timeout: only a signal to the main thread ends it
    if sys.argv[1:2] == ["graceful"]:  # as Flower's exit handler: once, SIGINT reset, then a slow exit
        def graceful(n, _):
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for _ in range(20):
                time.sleep(0.1)  # a second SIGINT here would raise KeyboardInterrupt
            sys.exit(0)
        signal.signal(signal.SIGINT, graceful)
        for _ in range(600):
            time.sleep(0.1)
    sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
'''


def _server(tmp_path, main_code: str | None = PROBE_MAIN, grace: float = forkserver.GRACE):
    """A fork server on tmp_path/fs/s, watching this test's process; its Popen and socket path."""
    d = tmp_path / "fs"
    d.mkdir(mode=0o700)
    sock = d / "s"
    main = "None" if main_code is None else "ns['main']"
    code = (f"import runpy; ns = {{}}; exec({main_code or ''!r}, ns)\n"
            f"fs = runpy.run_path({forkserver.__file__!r})\n"
            f"fs['serve']({str(sock)!r}, {os.getpid()}, main={main}, grace={grace!r})\n")
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert p.poll() is None, p.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return p, sock


def _script(tmp_path) -> Path:
    return launcher.write(tmp_path / "bin")


def test_the_fork_runs_with_the_scripts_arguments_directory_environment_and_streams(tmp_path):
    srv, sock = _server(tmp_path)
    try:
        script = _script(tmp_path)
        env = {**os.environ, launcher.FORK_ENV: str(sock), "DPFL_TEST_X": "x1"}
        res = subprocess.run([str(script), "7", "a b"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 7, res.stderr
        assert res.stdout.strip() == f"ARGV ['7', 'a b'] CWD {tmp_path} X x1"  # via the passed stdout
        assert res.stderr == ""
        res = subprocess.run([str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0 and "CWD / X x1" in res.stdout  # a second message: a new fork
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    assert not sock.exists() and not sock.parent.exists()  # the server cleans up after itself


def test_signals_reach_the_fork_and_a_killed_script_takes_it_along(tmp_path):
    srv, sock = _server(tmp_path)
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        for how, mark in ((signal.SIGTERM, tmp_path / "term"), (signal.SIGKILL, tmp_path / "kill")):
            p = subprocess.Popen([str(_script(tmp_path)), "sleep", str(mark)], env=env, stdout=subprocess.PIPE,
                                 text=True)
            assert p.stdout.readline().startswith("ARGV ['sleep'")  # the fork is running
            p.send_signal(how)
            p.wait(timeout=30)
            deadline = time.monotonic() + 30
            while not mark.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert mark.read_text() == "TERM", how  # the fork got SIGTERM: passed on, or its script gone
            if how == signal.SIGTERM:
                assert p.returncode == 3 and p.stdout.read().strip() == "TERM"  # the fork's own status
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def test_a_fork_killed_by_a_signal_ends_its_script_by_the_same_signal(tmp_path):
    # as a launched ClientApp killed by it would end; the fork cannot report it, the server does
    srv, sock = _server(tmp_path)
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        for sig in (signal.SIGKILL, signal.SIGUSR1):
            res = subprocess.run([str(_script(tmp_path)), "selfkill", str(int(sig))], env=env, capture_output=True,
                                 text=True, timeout=60, check=False)
            assert res.returncode == -sig and res.stdout.startswith("ARGV ['selfkill'"), (sig, res.stderr)
            assert "without an exit status" not in res.stderr
        res = subprocess.run([str(_script(tmp_path)), "4"], env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 4  # the server goes on
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def test_a_fork_that_ends_by_os_exit_gives_its_script_that_status(tmp_path):
    # the fork sends no status of its own: the server, which reaps it, does
    srv, sock = _server(tmp_path)
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        for status in (0, 7):
            res = subprocess.run([str(_script(tmp_path)), "osexit", str(status)], env=env, capture_output=True,
                                 text=True, timeout=60, check=False)
            assert res.returncode == status and "without an exit status" not in res.stderr, res.stderr
    finally:
        srv.terminate()
        srv.wait(timeout=30)


@contextmanager
def _fake_server(tmp_path):
    """A stand-in fork server: a script `--help` started against it, its request read; yields the
    script's Popen and the connection, to answer (or close) as a test's server would."""
    d = tmp_path / "fake"
    d.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(d / "s"))
        srv.listen(1)
        env = {**os.environ, launcher.FORK_ENV: str(d / "s")}
        p = subprocess.Popen([str(_script(tmp_path)), "--help"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        conn, _ = srv.accept()
        with conn:
            (n,) = struct.unpack("!I", forkserver._recv_exact(conn, 4))
            forkserver._recv_exact(conn, n)
            yield p, conn


def test_a_fork_killed_before_it_sent_its_pid_ends_its_script_by_that_signal(tmp_path):
    # the server's report comes where the pid would: the script must not take it for a pid
    with _fake_server(tmp_path) as (p, conn):
        conn.sendall(forkserver.INT.pack(-int(signal.SIGUSR1)))
        out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGUSR1 and out == "", err  # Flower's function never ran here


def _superexec_gone(tmp_path, mode: str, grace: float = forkserver.GRACE):
    """Start the probe in `mode` under a stand-in SuperExec, kill that SuperExec once the probe is
    running; the script's (return code, stderr, seconds from the kill to its end)."""
    srv, sock = _server(tmp_path, grace=grace)
    superexec = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        p = subprocess.Popen([str(_script(tmp_path)), mode, "--parent-pid", str(superexec.pid)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().startswith(f"ARGV [{mode!r}")
        superexec.kill()
        superexec.wait()
        t0 = time.monotonic()
        _, err = p.communicate(timeout=30)
        return p.returncode, err, time.monotonic() - t0
    finally:
        superexec.kill()
        srv.terminate()
        srv.wait(timeout=30)


def test_a_fork_whose_superexec_is_gone_is_interrupted_even_when_blocked(tmp_path):
    # Flower's own parent monitor raises SIGINT in its monitor thread only: a main thread blocked in a
    # wait without a timeout (a task pull from a SuperNode killed mid-message) would never see it
    code, err, _ = _superexec_gone(tmp_path, "block")
    assert code == 1 and "KeyboardInterrupt" in err


def test_flowers_graceful_exit_after_its_superexec_is_gone_is_not_cut_short(tmp_path):
    # Flower's handler runs once and resets SIGINT: a SIGINT of dpfl's on top would interrupt its exit
    code, err, _ = _superexec_gone(tmp_path, "graceful")
    assert code == 0 and "KeyboardInterrupt" not in err, err


def test_a_fork_that_outlives_its_superexec_by_the_grace_period_is_killed(tmp_path):
    # a ClientApp that ignores SIGINT: SIGKILL after the grace period
    code, err, seconds = _superexec_gone(tmp_path, "deaf", grace=1.0)
    assert code == -signal.SIGKILL, err  # the script ends as its fork did
    assert seconds >= 1.0  # not before the grace period


def test_a_bad_request_is_refused_in_one_line_and_the_server_goes_on(tmp_path):
    srv, sock = _server(tmp_path)
    try:
        for payload, fds in ((b"\x00\x00\x00\x05hello", [0, 1, 2]), (forkserver.encode_request(["x"], "/", {}), [0]),
                             (struct.pack("!I", forkserver.MAX_REQUEST + 1), [0, 1, 2])):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(sock))
                socket.send_fds(s, [payload], fds)
                assert s.recv(4) == b""  # closed: no fork
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        res = subprocess.run([str(_script(tmp_path)), "5"], env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 5 and res.stdout.startswith("ARGV ['5']")
    finally:
        srv.terminate()
        _, err = srv.communicate(timeout=30)
    lines = [ln for ln in err.splitlines() if ln.startswith("dpfl fork server: refused a request:")]
    assert len(lines) == 3, err
    assert "UTF-8 JSON" in lines[0] and "exactly 3 file descriptors, got 1" in lines[1]
    assert "over the 1048576-byte limit" in lines[2]


def test_dpfl_supernode_starts_a_server_that_ends_with_it(tmp_path):
    # the real wiring: dpfl-supernode starts the server in a new directory under TMPDIR and names it
    # in its environment; the SuperNode here tries a SuperLink that is not there until it is killed
    node = launcher.write_supernode(tmp_path / "bin", 0.5)
    tmp = tmp_path / "t"
    tmp.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has now

    def sock_file(path):  # a socket no server answers on, as a server killed with SIGKILL leaves it
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as x:
            x.bind(str(path))

    left = {f"dpfl-fork-{gone.pid}-a": ["s"],  # a server killed with SIGKILL: swept
            f"dpfl-fork-{gone.pid}-h": [],  # killed before it listened, or between its socket and folder: swept
            f"dpfl-fork-{gone.pid}-b": ["s", "other"],  # something else in it: kept whole
            f"dpfl-fork-{gone.pid}-c": [],  # a plain file named s, not a socket: kept
            f"dpfl-fork-{os.getpid()}-d": ["s"],  # a live SuperNode's: kept
            "dpfl-fork-e": ["s"],  # not named by a pid: kept
            "dpfl-fork-\u00b2-f": ["s"]}  # a digit that is not ASCII: kept, and no crash
    for name, files in left.items():
        (tmp / name).mkdir(mode=0o700)
        for f in files:
            sock_file(tmp / name / f) if f == "s" else (tmp / name / f).write_text("")
    (tmp / f"dpfl-fork-{gone.pid}-c" / "s").write_text("")
    victim = tmp_path / "victim"
    victim.mkdir()
    sock_file(victim / "s")
    (tmp / f"dpfl-fork-{gone.pid}-g").symlink_to(victim)  # a link: never followed
    left[f"dpfl-fork-{gone.pid}-g"] = []
    env = {**os.environ, "TMPDIR": str(tmp), "FLWR_TELEMETRY_ENABLED": "0"}
    env.pop(launcher.FORK_ENV, None)
    p = subprocess.Popen([str(node), "--insecure", "--superlink", "127.0.0.1:9", "--max-retries", "1000"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not list(tmp.glob(f"dpfl-fork-{p.pid}-*/s")) and time.monotonic() < deadline:
            time.sleep(0.1)
        (sock,) = tmp.glob(f"dpfl-fork-{p.pid}-*/s")
        assert sorted(d.name for d in tmp.iterdir() if d != sock.parent) == sorted(set(left) - {f"dpfl-fork-{gone.pid}-a", f"dpfl-fork-{gone.pid}-h"})
        assert sorted(f.name for f in (tmp / f"dpfl-fork-{gone.pid}-b").iterdir()) == ["other", "s"]
        assert (victim / "s").exists() and (tmp / f"dpfl-fork-{gone.pid}-c" / "s").is_file()
        assert oct(sock.parent.stat().st_mode & 0o777) == "0o700" and oct(sock.stat().st_mode & 0o777) == "0o600"
        (server,) = [pid for pid in descendants([p.pid]) if "forkserver" in _cmdline(pid)]
        argv = Path(f"/proc/{server}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert argv == [sys.executable, "-P", str(launcher.FORK_SERVER), str(sock), str(p.pid)]
        res = subprocess.run([str(launcher.write(tmp_path / "bin")), "--bogus"], env={**env, launcher.FORK_ENV: str(sock)},
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 2 and "usage: flwr-clientapp" in res.stderr and "fork server" not in res.stderr
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 30
    while sock.parent.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sock.parent.exists()  # the server saw its SuperNode go, and cleaned up


def test_without_a_server_the_script_runs_flowers_function_itself(tmp_path):
    script = _script(tmp_path)
    (tmp_path / "flwr.py").write_text("print('HIJACKED')\n")  # in the working directory: never imported
    base = {k: v for k, v in os.environ.items() if k != launcher.FORK_ENV}
    for env in ({}, {launcher.FORK_ENV: str(tmp_path / "none" / "s")}, {launcher.FORK_ENV: "relative/s"}):
        res = subprocess.run([str(script), "--help"], env={**base, **env}, capture_output=True, text=True,
                             timeout=120, check=False, cwd=tmp_path)
        assert res.returncode == 0 and res.stdout.startswith("usage: flwr-clientapp"), res.stderr
        assert res.stderr == "" and "HIJACKED" not in res.stdout


def test_a_server_that_closes_before_it_forks_leaves_the_script_to_run_flowers_function_once(tmp_path):
    with _fake_server(tmp_path) as (p, conn):
        conn.close()  # as a server does that refuses the request, or dies before it forks
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.count("usage: flwr-clientapp") == 1
    assert err.strip() == "flwr-clientapp (dpfl): the fork server refused the request"


def test_a_fork_that_cannot_start_says_so_where_its_pid_would_be_and_the_script_runs_flower_itself(tmp_path, capfd):
    srv, sock = _server(tmp_path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # a directory the fork cannot enter
            s.connect(str(sock))
            socket.send_fds(s, [forkserver.encode_request(["x"], str(tmp_path / "gone"), {})], [0, 1, 2])
            first = forkserver._recv_exact(s, forkserver.INT.size)
        assert forkserver.INT.unpack(first)[0] == 0  # not a pid, nor the status 1 that follows it
        res = subprocess.run([str(_script(tmp_path)), "5"], env={**os.environ, launcher.FORK_ENV: str(sock)},
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 5  # the server goes on
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    assert "could not start a ClientApp: FileNotFoundError" in capfd.readouterr().err  # on the passed stderr
    with _fake_server(tmp_path) as (p, conn):
        conn.sendall(forkserver.INT.pack(0))
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and out.count("usage: flwr-clientapp") == 1
    assert err.strip() == "flwr-clientapp (dpfl): the fork server could not start the ClientApp (its line above says why)"


def test_a_request_over_64_kib_arrives_whole(tmp_path):
    srv, sock = _server(tmp_path)
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock), "DPFL_TEST_X": "y" * 100_000, "DPFL_TEST_PAD": "z" * 100_000}
        res = subprocess.run([str(_script(tmp_path)), "4"], env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert res.returncode == 4 and res.stdout.strip().endswith("X " + "y" * 100_000)
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def test_exit_status_is_what_sys_exit_gives_a_process(capsys):
    assert [forkserver.exit_status(c) for c in (None, 0, 7, 256, -1)] == [0, 0, 7, 0, 255]
    assert forkserver.exit_status("bad thing") == 1 and capsys.readouterr().err == "bad thing\n"


def test_the_server_holds_no_random_state_its_forks_would_share():
    # dpfl's secrets come from the OS (os.urandom); a generator imported into the server would be
    # copied into every fork: neither torch nor numpy.random may be loaded by Flower's module. And
    # the phases that do not train load neither torch nor scipy (test_client_startup.py): nor may
    # the server they are forked from
    code = (f"import runpy, sys; fs = runpy.run_path({forkserver.__file__!r}); fs['load_main']()\n"
            "print(sorted(m for m in ('torch', 'scipy', 'numpy.random', 'dpfl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         timeout=120, cwd="/").stdout
    assert out.strip() == "[]"
    assert launcher.FORK_ENV == forkserver.ENV


def test_the_real_server_runs_flowers_clientapp(tmp_path):
    srv, sock = _server(tmp_path, main_code=None)  # serve() loads Flower's flwr_clientapp
    try:
        env = {**os.environ, launcher.FORK_ENV: str(sock)}
        t = time.perf_counter()
        res = subprocess.run([str(_script(tmp_path)), "--bogus"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert res.returncode == 2 and res.stdout == ""
        assert "usage: flwr-clientapp" in res.stderr and "--token" in res.stderr  # Flower's own parser
        assert "fork server" not in res.stderr  # served by the fork, not the fallback
        assert time.perf_counter() - t < 30
    finally:
        srv.terminate()
        srv.wait(timeout=30)


# ---- the request parser -----------------------------------------------------------------------
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)


@settings(max_examples=200, deadline=None)
@given(argv=st.lists(texts, min_size=1, max_size=5), env=st.dictionaries(
    texts.filter(lambda k: k and "=" not in k), texts, max_size=5))
def test_a_request_reads_back_as_written(argv, env):
    data = forkserver.encode_request(argv, "/some/dir", env)
    assert struct.unpack("!I", data[:4])[0] == len(data) - 4
    assert forkserver.parse_request(data[4:]) == (argv, "/some/dir", env)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.builds(lambda o: json.dumps(o).encode(), st.recursive(
    st.none() | st.booleans() | st.integers() | texts, lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["argv", "cwd", "env", "x"]), c, max_size=4), max_leaves=10))))
def test_any_other_bytes_are_refused_with_a_value_error(data):
    try:
        argv, cwd, env = forkserver.parse_request(data)
    except ValueError:
        return
    assert isinstance(argv, list) and argv and os.path.isabs(cwd) and isinstance(env, dict)


@pytest.mark.parametrize("obj, why", [
    ({"argv": [], "cwd": "/", "env": {}}, "argv must be a list of 1 to"),
    ({"argv": ["a"], "cwd": "rel", "env": {}}, "cwd must be an absolute path"),
    ({"argv": ["a"], "cwd": "/", "env": {"A=B": "c"}}, "hold no '='"),
    ({"argv": ["a\0"], "cwd": "/", "env": {}}, "no NUL"),
    ({"argv": ["a"], "cwd": "/", "env": {"A": 1}}, "env must map strings to strings"),
    ({"argv": ["a"], "cwd": "/"}, "exactly the keys argv, cwd and env"),
])
def test_each_bad_field_is_named(obj, why):
    with pytest.raises(ValueError, match=why):
        forkserver.parse_request(json.dumps(obj).encode())


def test_the_server_file_imports_nothing_of_dpfl():
    # started by its path, so that a ClientApp's own `import dpfl.flower` happens in the fork
    code = f"import runpy, sys; runpy.run_path({forkserver.__file__!r}); print(sorted(m for m in sys.modules if m.startswith('dpfl')))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60, cwd="/").stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="a zombie is told from /proc")
def test_a_zombie_is_not_alive():
    """A process that ended but was not waited for (its parent a PID 1 that does not reap, as a
    container's own command) no longer holds a site worker or a fork open."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while Path(f"/proc/{p.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert not forkserver.alive(p.pid)
        assert forkserver.alive(os.getpid())
    finally:
        p.wait()
    assert not forkserver.alive(p.pid)
