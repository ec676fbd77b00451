"""dpfl's `flwr-clientapp` (dpfl.flower.launcher): Flower's own function, started without the
SuperNode's command modules, and only from a directory no one else may write to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dpfl.cli.main import app
from dpfl.errors import ConfigError
from dpfl.flower import launcher
from dpfl.flower.local import LocalFederation

PROBE = """
import sys
sys.argv = ["-c", "flwr-clientapp", "--help"]  # as the script runs it: python -c FULL SCRIPT ARGS
try:
    exec(compile({full!r}, "<flwr-clientapp>", "exec"), {{"__name__": "__main__"}})
except SystemExit as e:
    code = e.code
print("EXIT", code)
print("SUPERNODE_CLI", "flwr.supernode.cli.flower_supernode" in sys.modules)
print("SQLALCHEMY", "sqlalchemy" in sys.modules)
"""


def test_the_script_is_flowers_clientapp_without_the_supernode_command(tmp_path):
    path = launcher.write(tmp_path / "bin")
    assert path.name == "flwr-clientapp" and oct(path.stat().st_mode & 0o777) == "0o700"
    assert path.read_text().splitlines()[0] == f"#!{sys.executable} -S"  # no site: the script needs the stdlib only
    assert repr(launcher.FULL) in path.read_text()  # what it runs where no fork server answers
    out = subprocess.run([sys.executable, "-c", PROBE.format(full=launcher.FULL)], capture_output=True, text=True,
                         check=False, timeout=120).stdout
    assert "usage: flwr-clientapp" in out and "--runtime-api-address" in out  # Flower's own parser
    assert "EXIT 0" in out
    assert "SUPERNODE_CLI False" in out and "SQLALCHEMY False" in out
    # and Flower's own script does load them (what the launcher saves)
    code = ("import sys, flwr.supernode.cli; "
            "print('flwr.supernode.cli.flower_supernode' in sys.modules, 'sqlalchemy' in sys.modules)")
    own = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    assert own.strip() == "True True"


def test_the_script_runs_as_a_command(tmp_path):
    path = launcher.write(tmp_path / "bin")
    res = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.startswith("usage: flwr-clientapp")


def test_a_directory_others_may_write_to_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by no one else"):
        launcher.write(d)
    assert not (d / launcher.NAME).exists()


def test_a_rewrite_replaces_dpfls_file_and_refuses_any_other(tmp_path):
    path = launcher.write(tmp_path / "bin")
    path.write_text(path.read_text() + "raise SystemExit(3)\n")  # an older dpfl's, say
    assert launcher.write(tmp_path / "bin") == path and "SystemExit(3)" not in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["flwr-clientapp"]  # no temporary left
    path.write_text("#!/bin/sh\nexit 3\n")  # Flower's own entry point, say, in a virtualenv's bin
    with pytest.raises(ConfigError, match="was not written by dpfl: not replacing it"):
        launcher.write(tmp_path / "bin")
    assert path.read_text() == "#!/bin/sh\nexit 3\n"
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="was not written by dpfl"):
        launcher.write(tmp_path / "bin")
    assert path.is_symlink() and not (tmp_path / "elsewhere").exists()


def test_a_linked_directory_or_one_under_a_folder_others_may_change_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        launcher.write(tmp_path / "link")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may rename bin/ and put their own there
    with pytest.raises(ConfigError, match="may be changed by other users"):
        launcher.write(shared / "bin")
    shared.chmod(0o1777)  # sticky, like /tmp: only the owner may rename its entries
    assert launcher.write(shared / "bin").is_file()


def test_the_file_is_closed_to_others_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = launcher.write_supernode(tmp_path / "bin", 0.5)
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == "0o700"


def test_an_unset_path_keeps_the_systems_default(tmp_path, monkeypatch):
    monkeypatch.delenv("PATH", raising=False)
    fed = LocalFederation(tmp_path / "fed", 1)
    assert fed.env["PATH"] == os.pathsep.join([str((tmp_path / "fed" / "bin").resolve()), os.defpath])


def test_where_flowers_file_is_missing_the_script_imports_it_the_usual_way(tmp_path):
    probe = ("import os, sys\nreal = os.path.isfile\n"
             "os.path.isfile = lambda p: False if p.endswith('flwr_clientapp.py') else real(p)\n"
             + PROBE.split("\n", 2)[2])
    out = subprocess.run([sys.executable, "-c", probe.format(full=launcher.FULL)], capture_output=True, text=True,
                         check=False, timeout=120).stdout
    assert "usage: flwr-clientapp" in out and "EXIT 0" in out
    assert "SUPERNODE_CLI True" in out  # the package's __init__ came along


def test_a_local_federation_puts_it_first_on_the_supernodes_path(tmp_path):
    fed = LocalFederation(tmp_path / "fed", 1)
    assert fed.env["PATH"].split(os.pathsep)[0] == str((tmp_path / "fed" / "bin").resolve())
    plain = LocalFederation(tmp_path / "fed2", 1, launcher="flower")
    assert plain.env["PATH"] == os.environ.get("PATH")


def test_the_command_writes_it_and_refuses_a_shared_directory(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["flower", "launcher", str(tmp_path / "bin")])
    assert res.exit_code == 0 and (tmp_path / "bin" / "flwr-clientapp").is_file()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    res = runner.invoke(app, ["flower", "launcher", str(shared)])
    assert res.exit_code == 2 and "writable by no one else" in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


def test_a_python_path_with_a_space_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/opt/my env/bin/python3")
    with pytest.raises(ConfigError, match="holds a space"):
        launcher.write(tmp_path / "bin")


# ---- dpfl-supernode: Flower's SuperNode with a shorter idle poll -----------------------------
NODE_PROBE = """
import runpy, sys, time
calls = []
time.sleep = calls.append  # the proxy's sleeps land here, not in a real wait
import flwr.supernode.start_client_internal as loop
{setup}
sys.argv = ["dpfl-supernode", "--help"]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as e:
    print("EXIT", repr(e.code))
loop.time.sleep(3); loop.time.sleep(0.5); loop.time.sleep(1.25)
print("SLEEPS", calls)
print("CLOCK", loop.time.monotonic is time.monotonic)
import flwr.common.constant as c, flwr.supercore.heartbeat as hb, flwr.supernode.fleet_http_connection as fleet
print("HEARTBEAT", fleet.HEARTBEAT_DEFAULT_INTERVAL, hb.HEARTBEAT_DEFAULT_INTERVAL, c.HEARTBEAT_DEFAULT_INTERVAL)
"""


def _probe(path, setup=""):
    return subprocess.run([sys.executable, "-c", NODE_PROBE.format(path=str(path), setup=setup)], capture_output=True,
                          text=True, check=False, timeout=120)


def test_the_supernode_script_is_flowers_with_the_idle_poll_shortened(tmp_path):
    path = launcher.write_supernode(tmp_path / "bin", 0.25)
    assert path.name == "dpfl-supernode" and oct(path.stat().st_mode & 0o777) == "0o700"
    res = _probe(path)
    assert "usage: dpfl-supernode" in res.stdout and "--superlink" in res.stdout  # Flower's own parser
    assert "EXIT 0" in res.stdout
    # the loop's 3 s idle wait becomes 0.25 s, its 0.5 s reply checks 0.05 s; any other wait and clock is kept
    assert "SLEEPS [0.25, 0.05, 1.25]" in res.stdout and "CLOCK True" in res.stdout
    assert "HEARTBEAT 30 30 30" in res.stdout  # by default Flower's heartbeat, untouched
    res = _probe(launcher.write_supernode(tmp_path / "quick", 0.25, heartbeat=10))
    # the node declares (and beats for) a 10 s interval; Flower's constant (the app tokens' window) is kept
    assert "EXIT 0" in res.stdout and "HEARTBEAT 10 10 30" in res.stdout
    ran = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0 and ran.stdout.startswith("usage: dpfl-supernode")


def test_a_flower_whose_loop_differs_is_refused_in_one_line(tmp_path):
    path = launcher.write_supernode(tmp_path / "bin", 0.25)
    other = tmp_path / "start_client_internal.py"
    other.write_text("import time\n\ndef loop():\n    time.sleep(2)\n")  # a later Flower, say, that waits 2 s
    res = _probe(path, setup=f"loop.__file__ = {str(other)!r}")
    out = res.stdout + res.stderr
    assert "is not the one this script changes; start flower-supernode instead" in out
    assert "usage:" not in out and "EXIT 0" not in out  # Flower not run
    assert "SLEEPS [3, 0.5, 1.25]" in out  # and its loop left as it is


def test_a_flower_whose_heartbeat_differs_is_refused_in_one_line(tmp_path):
    setup = "import flwr.supercore.heartbeat as hb; hb.HEARTBEAT_DEFAULT_INTERVAL = 60"
    res = _probe(launcher.write_supernode(tmp_path / "bin", 0.25, heartbeat=10), setup=setup)
    out = res.stdout + res.stderr
    assert "the heartbeat of Flower" in out and "start flower-supernode instead" in out
    assert "usage:" not in out and "HEARTBEAT 30 60 30" in out  # Flower not run, nothing changed
    res = _probe(launcher.write_supernode(tmp_path / "own", 0.25), setup=setup)  # Flower's interval: not changed
    assert "EXIT 0" in res.stdout and "HEARTBEAT 30 60 30" in res.stdout


# the script's patches applied in this process (its --help ends it before Flower starts), and an
# HTTP error as the SuperLink's client raises it
SCRIPT_RUN = """
import os, runpy, signal, sys, time
import httpx
sys.argv = ["dpfl-supernode", "--help"]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as e:
    print("EXIT", repr(e.code))

def status(code):
    req = httpx.Request("POST", "https://superlink/v1/fleet")
    return httpx.HTTPStatusError(f"HTTP {{code}}", request=req, response=httpx.Response(code, request=req))
"""

BEAT_PROBE = SCRIPT_RUN + """
import flwr.supercore.heartbeat as hb, flwr.supernode.fleet_http_connection as fleet
hb.HEARTBEAT_DEFAULT_INTERVAL = 5.5  # a beat every 0.4 s or so, not to wait here
signals = []
signal.signal(signal.SIGINT, lambda *_: signals.append("SIGINT"))

answers = [status(500), status(500), True, True, status(404), RuntimeError("not recognised"), True, status(401)]
calls = []

def beat():  # Flower's send_node_heartbeat, answered in turn
    a = answers[min(len(calls), len(answers) - 1)]
    calls.append(a)
    if isinstance(a, httpx.HTTPStatusError) and a.response.status_code == 401:
        os.kill(os.getpid(), signal.SIGINT)  # as Flower's
    if isinstance(a, Exception):
        raise a
    return a

sender = fleet.HeartbeatSender(beat)
sender.start()
end = time.monotonic() + 60
while len(calls) < len(answers) and time.monotonic() < end:
    time.sleep(0.05)
time.sleep(1.5)  # no beat after the 401
print("CALLS", len(calls), "ALIVE", sender._thread.is_alive(), "SIGNALS", signals)
if sender._thread.is_alive():
    sender.stop()
print("STOPPED", not sender._thread.is_alive())
"""


def test_the_supernodes_heartbeat_survives_any_error_but_a_401(tmp_path):
    """Flower's node heartbeat thread ends on an HTTP 500 (and on any error but 502-504), leaving a
    running site offline for good: dpfl-supernode retries every error with Flower's backoff, saying so
    once a streak; on a 401, on which Flower signals the SuperNode to end, it beats no more."""
    path = launcher.write_supernode(tmp_path / "bin", 0.25)
    res = subprocess.run([sys.executable, "-c", BEAT_PROBE.format(path=str(path))], capture_output=True,
                         text=True, check=False, timeout=120)
    assert "EXIT 0" in res.stdout, res.stdout + res.stderr
    assert "CALLS 8 ALIVE True SIGNALS ['SIGINT']" in res.stdout and "STOPPED True" in res.stdout, \
        res.stdout + res.stderr
    err = res.stderr
    assert err.count("dpfl: a heartbeat to the SuperLink failed (HTTPStatusError: HTTP 500); retrying") == 1
    assert err.count("dpfl: a heartbeat to the SuperLink failed (HTTPStatusError: HTTP 404); retrying") == 1
    assert err.count("dpfl: heartbeats answered again") == 2
    assert "not recognised" not in err and "Traceback" not in err  # the same streak as the 404


RETRY_PROBE = SCRIPT_RUN + """
import flwr.supernode.fleet_http_connection as fleet
from dpfl.flower import retries
assert fleet.make_simple_http_retry_invoker is retries.patient_invoker  # what the script put there

def failing(*codes):
    left = list(codes)
    def call():
        if left:
            raise status(left.pop(0))
        return "answered"
    return call

def invoker(wait=0.0):
    inv = fleet.make_simple_http_retry_invoker()  # what the SuperNode's connection makes
    inv.wait_function = lambda seconds: time.sleep(wait)
    return inv

def outcome(inv, *codes):
    try:
        return inv.invoke(failing(*codes))
    except httpx.HTTPStatusError as e:
        return f"gave up on {{e.response.status_code}}"

print("RETRIED", outcome(invoker(), 500, 429, 408, 503, 500, 502))
print("BAD REQUEST", outcome(invoker(), 400))
retries.PATIENCE = 0.2
inv = invoker(0.15)
print("STREAK", outcome(inv, 500, 500, 500))
inv = invoker(0.15)
first = outcome(inv, 500)
time.sleep(0.3)
print("NEW STREAK", first, outcome(inv, 500))  # the success in between starts the count again
"""


def test_the_supernodes_requests_retry_a_500_as_flower_retries_a_503(tmp_path):
    """Flower's SuperNode gives up on an HTTP 500 from the SuperLink (its loop ends, the node leaves
    the federation): dpfl-supernode's requests retry 500, 408 and 429 as Flower retries 502-504, until
    PATIENCE s of them in a row; a 400 still ends them."""
    path = launcher.write_supernode(tmp_path / "bin", 0.25)
    res = subprocess.run([sys.executable, "-c", RETRY_PROBE.format(path=str(path))], capture_output=True,
                         text=True, check=False, timeout=120)
    out = res.stdout + res.stderr
    assert "EXIT 0" in res.stdout and "RETRIED answered" in res.stdout, out
    assert "BAD REQUEST gave up on 400" in res.stdout, out
    assert "STREAK gave up on 500" in res.stdout, out  # 0.3 s of 500s, past a patience of 0.2 s
    assert "NEW STREAK answered answered" in res.stdout, out


END_PROBE = """
import runpy, sys, threading, time
import flwr.supernode.cli
threading.Thread(target=time.sleep, args=(300,), daemon={daemon}).start()  # Flower's Runtime API thread
flwr.supernode.cli.flower_supernode = {fake}
sys.argv = ["dpfl-supernode"]
runpy.run_path({path!r}, run_name="__main__")
print("NOT ENDED", flush=True)
"""


# (Flower's own exits force theirs after 5 s: the stand-in thread is a daemon there)
@pytest.mark.parametrize("fake, code, daemon", [("lambda: None", 75, False), ("lambda: sys.exit(3)", 3, True),
                                                ("lambda: 1 / 0", 75, False)])
def test_a_supernode_whose_loop_ends_exits_with_75_not_hangs(tmp_path, fake, code, daemon):
    """Flower's SuperNode whose loop ends on an error (logged) returns, and its Runtime API thread keeps
    the process up, out of the federation: dpfl-supernode exits with 75 (EX_TEMPFAIL), for a service
    manager to start it again; Flower's own exits keep their codes."""
    path = launcher.write_supernode(tmp_path / "bin", 0.25)
    res = subprocess.run([sys.executable, "-c", END_PROBE.format(path=str(path), fake=fake, daemon=daemon)], capture_output=True,
                         text=True, check=False, timeout=60)
    assert res.returncode == code and "NOT ENDED" not in res.stdout, res.stdout + res.stderr
    said = ("exiting with code 75, to be started again" in res.stderr) + ("ZeroDivisionError" in res.stderr)
    assert said == {"lambda: None": 1, "lambda: 1 / 0": 2}.get(fake, 0), res.stderr


def test_a_flower_whose_retries_differ_is_refused_in_one_line(tmp_path):
    for setup in ["import flwr.supercore.retry.retry_invoker as r; r.RetryInvoker.invoke = lambda s, f, *a, **k: f()",
                  "import flwr.supernode.fleet_http_connection as f; f.HeartbeatSender = object"]:
        res = _probe(launcher.write_supernode(tmp_path / "bin", 0.25), setup=setup)
        out = res.stdout + res.stderr
        assert "the retries of Flower" in out and "start flower-supernode instead" in out, out
        assert "usage:" not in out and "EXIT 0" not in out


@pytest.mark.parametrize("seconds", [9.9, 1800.5, float("nan"), True, "10"])
def test_a_heartbeat_outside_the_superlinks_bounds_is_refused(tmp_path, seconds):
    with pytest.raises(ConfigError, match="heartbeat interval must be 10 to 1800 s"):
        launcher.write_supernode(tmp_path / "bin", 0.5, heartbeat=seconds)
    assert not (tmp_path / "bin").exists()
    res = CliRunner().invoke(app, ["flower", "launcher", str(tmp_path / "c"), "--node-heartbeat", "10"])
    assert res.exit_code == 2 and "give --node-poll too" in res.output and not (tmp_path / "c").exists()
    res = CliRunner().invoke(app, ["flower", "launcher", str(tmp_path / "c"), "--node-poll", "0.5",
                                   "--node-heartbeat", "5"])
    assert res.exit_code == 2 and "heartbeat interval must be 10 to 1800 s" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["flower", "launcher", str(tmp_path / "c"), "--node-poll", "0.5",
                                   "--node-heartbeat", "60"])
    assert res.exit_code == 0 and "HEARTBEAT = 60\n" in (tmp_path / "c" / launcher.SUPERNODE).read_text()


@pytest.mark.parametrize("poll", [0.0, 0.01, 3.0, 5.0, float("nan"), -1.0])
def test_a_poll_outside_its_range_is_refused(tmp_path, poll):
    with pytest.raises(ConfigError, match="SuperNode poll must be at least 0.05 s and under Flower's own 3 s"):
        launcher.write_supernode(tmp_path / "bin", poll)
    assert not (tmp_path / "bin").exists()


def test_a_local_federation_runs_its_supernodes_with_the_poll_or_flowers_own(tmp_path):
    fed = LocalFederation(tmp_path / "fed", 1)  # the default: dpfl-supernode, 0.5 s, a 10 s heartbeat
    assert fed.supernode_command(0, 9094)[0] == str((tmp_path / "fed" / "bin" / "dpfl-supernode").resolve())
    fed.write_bin()
    text = (tmp_path / "fed" / "bin" / "dpfl-supernode").read_text()
    assert "POLL = 0.5\n" in text and "HEARTBEAT = 10\n" in text and launcher.LOCAL_HEARTBEAT == 10
    assert fed.node_poll == launcher.LOCAL_POLL == 0.5
    own = LocalFederation(tmp_path / "fed2", 1, node_poll=None)
    assert own.supernode_command(0, 9094)[0] == "flower-supernode"
    with pytest.raises(ConfigError, match="SuperNode poll"):
        LocalFederation(tmp_path / "fed3", 1, node_poll=3.5)


def test_a_foreign_supernode_file_stops_the_command_before_it_writes_anything(tmp_path):
    d = tmp_path / "bin"
    d.mkdir(mode=0o700)
    (d / launcher.SUPERNODE).write_text("#!/bin/sh\nexit 3\n")  # not dpfl's
    res = CliRunner().invoke(app, ["flower", "launcher", str(d), "--node-poll", "0.5"])
    said = " ".join(res.output.split())  # the console wraps long lines at its width (the path's length varies)
    assert res.exit_code == 2 and "was not written by dpfl: not replacing it" in said, res.output
    assert res.output.count("error:") == 1 and "Traceback" not in res.output
    assert sorted(p.name for p in d.iterdir()) == [launcher.SUPERNODE]  # flwr-clientapp not written either
    assert (d / launcher.SUPERNODE).read_text() == "#!/bin/sh\nexit 3\n"


def test_the_commands_take_node_poll(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["flower", "launcher", str(tmp_path / "bin"), "--node-poll", "0.5"])
    assert res.exit_code == 0, res.output
    assert launcher.MARK in (tmp_path / "bin" / "dpfl-supernode").read_text()
    assert "POLL = 0.5" in (tmp_path / "bin" / "dpfl-supernode").read_text()
    for cmd in (["flower", "launcher", str(tmp_path / "b2"), "--node-poll", "0"],
                ["bench", "flower", "--node-poll", "4"], ["flower", "local", "--node-poll", "0.01"],
                ["bench", "flower-idle", "--node-poll", "0.5", "--node-poll", "0"]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 2 and "SuperNode poll must be at least" in res.output, (cmd, res.output)
        assert "Traceback" not in res.output
    assert not (tmp_path / "b2").exists()


def test_dpfl_supernode_starts_the_fork_server_unless_told_not_to(tmp_path):
    on = launcher.write_supernode(tmp_path / "a", 0.5).read_text()
    assert f"FORK_SERVER = {str(launcher.FORK_SERVER)!r}" in on and launcher.FORK_SERVER.is_file()
    off = launcher.write_supernode(tmp_path / "b", 0.5, fork=False).read_text()
    assert "FORK_SERVER = None" in off
    for text in (on, off):  # an inherited socket path is never used by a SuperNode that started no server
        assert f'os.environ.pop("{launcher.FORK_ENV}", None)' in text
    res = CliRunner().invoke(app, ["flower", "launcher", str(tmp_path / "c"), "--node-poll", "0.5", "--no-fork"])
    assert res.exit_code == 0 and "FORK_SERVER = None" in (tmp_path / "c" / launcher.SUPERNODE).read_text()
    res = CliRunner().invoke(app, ["flower", "launcher", str(tmp_path / "d"), "--fork"])
    assert res.exit_code == 2 and "--fork/--no-fork and --node-heartbeat apply to dpfl-supernode: give --node-poll too" in res.output
    assert not (tmp_path / "d").exists()


def test_the_launcher_follows_the_supernode(tmp_path):
    assert LocalFederation(tmp_path / "f1", 1).launcher == "fork"  # dpfl-supernode starts the fork server
    assert LocalFederation(tmp_path / "f2", 1, node_poll=None).launcher == "dpfl"  # Flower's flower-supernode
    with pytest.raises(ConfigError, match="--launcher fork needs dpfl-supernode"):
        LocalFederation(tmp_path / "f3", 1, launcher="fork", node_poll=None)
    with pytest.raises(ConfigError, match="--launcher must be one of fork, dpfl, flower"):
        LocalFederation(tmp_path / "f4", 1, launcher="spawn")
    res = CliRunner().invoke(app, ["bench", "flower", "--launcher", "fork", "--node-poll", "3"])
    assert res.exit_code == 2 and "--launcher fork needs dpfl-supernode" in res.output


@pytest.mark.skipif(sys.prefix != sys.base_prefix, reason="a venv inside a venv does not see the outer one's flwr")
def test_dpfl_supernode_refuses_a_python_without_flowers_commands_and_puts_its_own_first(tmp_path):
    """A venv that found flwr installed outside it (--system-site-packages) has no flower-superexec
    of its own: the SuperNode would start the base environment's through PATH (a pyenv shim also
    puts that environment's bin first, so Flower's own flwr-clientapp and another dpfl run).
    Refused in one line; otherwise flwr's scripts directory comes right after dpfl's own on PATH,
    both first, however the directory is spelled (here through a link)."""
    from importlib import metadata

    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=120, check=False)
    if made.returncode:  # e.g. Debian's python3 without python3-venv
        pytest.skip(f"this Python cannot make a venv: {made.stderr.strip()[-200:]}")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    path = launcher.write_supernode(tmp_path / "real" / "bin", 0.5, fork=False)
    linked = tmp_path / "link" / "bin"
    env = {**os.environ, "PATH": os.pathsep.join(["/nowhere", str(linked), os.environ.get("PATH", "")])}
    res = subprocess.run([str(venv / "bin" / "python"), str(path), "--help"], capture_output=True, text=True,
                         timeout=120, check=False, env=env)
    assert res.returncode == 1 and "usage:" not in res.stdout, res.stdout
    assert f"the flwr this Python ({venv / 'bin' / 'python'}) imports has " in res.stderr, res.stderr
    assert "whose ClientApps do not run this dpfl" in res.stderr and "--no-deps flwr==" in res.stderr
    p = str(path)
    probe = (f"import os, runpy, sys\nsys.argv = [{p!r}, '--help']\n"
             "import flwr.supernode.cli as c\nc.flower_supernode = lambda: print('PATH', os.environ['PATH'])\n"
             f"runpy.run_path({p!r}, run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False,
                         env=env).stdout
    dist = metadata.distribution("flwr")
    (script,) = [dist.locate_file(f) for f in dist.files if f.name == "flower-superexec"]
    here = os.path.realpath(os.path.dirname(script))
    assert f"PATH {linked}{os.pathsep}{here}{os.pathsep}/nowhere{os.pathsep}" in out, out
