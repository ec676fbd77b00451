"""A quicker start for the ClientApp processes Flower launches, one per message.

Flower's SuperExec starts each ClientApp as the command `flwr-clientapp`, found on its PATH.
Flower's own script for it imports the package `flwr.supernode.cli`, whose `__init__` also imports
the SuperNode's command (its SQL state, FastAPI, ...), none of which a ClientApp uses: 2.0 s of
imports on a 2-core Xeon, for every message. `write(directory)` writes a `flwr-clientapp` there
that runs the same function, `flwr_clientapp()` from Flower's file `supernode/cli/flwr_clientapp.py`,
loaded without that package's `__init__` (0.7 s), under this Python (no version-manager shim).
Put the directory first on the SuperNode's PATH: `dpfl flower local` does, a site started by hand
may (docs/deployment.md). Where Flower has no such file, the script imports it the usual way.

`write_supernode(directory, poll)` writes `dpfl-supernode`: Flower's own `flower-supernode`, but
idle for `poll` s between its pulls from the SuperLink instead of 3 s, and checking for a
ClientApp's reply every 0.05 s instead of 0.5 s. Flower has no setting for either: both are
constants in `flwr/supernode/start_client_internal.py`, which the script changes for its own
process only, after checking that the file holds them as it expects (else it refuses in one line).
A poll of 3 s makes no change: use `flower-supernode`. Each pull is one request to the SuperLink:
fine for a few sites, not for thousands. `heartbeat` changes the interval the node declares in its
heartbeats (Flower: 30 s; the SuperLink counts it offline after two), checked the same way.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from dpfl.errors import ConfigError
from dpfl.flower.forkserver import ENV as FORK_ENV

NAME = "flwr-clientapp"
MARK = "# written by dpfl.flower.launcher"
FORK_SERVER = Path(__file__).with_name("forkserver.py")

FULL = f'''import runpy
import sys
sys.argv = sys.argv[1:]  # run as `python -c FULL SCRIPT ARGS...`: argv[0] is the script's path
# Flower's flwr_clientapp, loaded as the fork server loads it (forkserver.py: load_main)
sys.exit(runpy.run_path({str(FORK_SERVER)!r})["load_main"]()())
'''

SCRIPT = '''#!{python} -S
{mark}: Flower's own `flwr-clientapp`. Where the SuperNode started dpfl's fork
# server (dpfl-supernode; dpfl/flower/forkserver.py), a fork of it runs Flower's function with this
# process's arguments, directory, environment and streams; else this Python runs it, loaded without
# the package flwr.supernode.cli, whose __init__ imports the SuperNode's command (unused by a ClientApp)
import json
import os
import signal
import socket
import struct
import sys

FULL = {full!r}
INT = struct.Struct("!i")
WAIT = 10.0  # s for the fork server to answer with the fork's pid


def recv_int(s):
    buf = b""
    while len(buf) < INT.size:
        chunk = s.recv(INT.size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return INT.unpack(buf)[0]


FORWARD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def ended_by(sig):
    # the fork was killed by signal sig: so is this process, as a launched one would be
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARD)
    if not 0 < sig < signal.NSIG:
        print(f"flwr-clientapp (dpfl): the fork server reported signal {{sig}}, not one", file=sys.stderr, flush=True)
        return 1
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
        pass
    os.kill(os.getpid(), sig)
    return 128 + sig  # not ended by it after all: the shell's status for it


def forked():
    # the fork's exit status; None where no fork server ran Flower's function
    path = os.environ.get("{env}", "")
    if not path.startswith("/") or not hasattr(socket, "SO_PEERCRED"):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(WAIT)  # a stopped or stuck server: run Flower's function here instead
    try:
        s.connect(path)
        uid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
        if uid != os.getuid():
            raise OSError(f"the fork server at {{path}} is another user's")
        data = json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
        data = struct.pack("!I", len(data)) + data
        sent = socket.send_fds(s, [data], [0, 1, 2])
        if sent < len(data):
            s.sendall(data[sent:])
        pid = recv_int(s)
    except (OSError, ValueError) as e:
        s.close()  # a fork that started anyway sees it closed and ends (SIGTERM) before it runs twice
        if not isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
            print(f"flwr-clientapp (dpfl): fork server not used: {{e}}", file=sys.stderr, flush=True)
        return None
    if pid is None or pid == 0:  # refused before it forked, or the fork could not start: nothing ran
        s.close()
        why = "refused the request" if pid is None else "could not start the ClientApp (its line above says why)"
        print(f"flwr-clientapp (dpfl): the fork server {{why}}", file=sys.stderr, flush=True)
        return None
    if pid < 0:  # the fork was killed before it sent its pid: the server's report
        s.close()
        return ended_by(-pid)
    s.settimeout(None)
    try:
        pidfd = os.pidfd_open(pid)  # signals reach this child even once its pid is reused
    except (AttributeError, OSError):
        pidfd = None

    def forward(n, _):
        try:
            if pidfd is None:
                os.kill(pid, n)
            else:
                signal.pidfd_send_signal(pidfd, n)
        except OSError:  # it has ended
            pass

    for sig in FORWARD:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARD)  # one that came meanwhile is forwarded now
    code = recv_int(s)
    if code is None:
        print(f"flwr-clientapp (dpfl): the forked ClientApp (pid {{pid}}) ended without an exit status",
              file=sys.stderr, flush=True)
        return 1
    return ended_by(-code) if code < 0 else code


signal.pthread_sigmask(signal.SIG_BLOCK, FORWARD)  # held until the fork's pid is known, to forward them
try:
    code = forked()
finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARD)  # before Flower's function runs here (exec keeps the mask)
if code is None:
    os.execv(sys.executable, [sys.executable, "-P", "-c", FULL, *sys.argv])  # -P: no cwd on sys.path
sys.exit(code)
'''


SUPERNODE = "dpfl-supernode"
FLOWER_POLL = 3.0  # Flower's SuperNode: idle seconds between pulls (start_client_internal.py)
POLL_RANGE = (0.05, 3.0)
FLOWER_HEARTBEAT = 30.0  # the heartbeat interval Flower's SuperNode declares (HEARTBEAT_DEFAULT_INTERVAL)
HEARTBEAT_RANGE = (10.0, 1800.0)  # the SuperLink's bounds (HEARTBEAT_MIN_INTERVAL, HEARTBEAT_MAX_INTERVAL)
LOCAL_HEARTBEAT = 10.0  # a local federation's: a killed site is offline 20 s after its last heartbeat
LOCAL_POLL = 0.5  # a local federation's SuperNodes (loopback, a few sites): `dpfl flower local`, `dpfl bench flower`

SUPERNODE_SCRIPT = '''#!{python}
{mark}: Flower's own `flower-supernode`, idle {poll} s between its pulls from
# the SuperLink (Flower: 3 s), checking for a ClientApp's reply every 0.05 s (Flower: 0.5 s) and
# declaring a {heartbeat} s heartbeat interval (Flower: 30 s); with dpfl's fork server for its
# ClientApps where FORK_SERVER names it (dpfl/flower/forkserver.py)
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time

import flwr
import flwr.supernode.start_client_internal as loop

POLL = {poll!r}
with open(loop.__file__, encoding="utf-8") as f:
    text = f.read()
if text.count("time.sleep(3)") != 1 or text.count("time.sleep(0.5)") != 2 or loop.time is not time:
    sys.exit(f"dpfl-supernode: the SuperNode loop of Flower {{flwr.__version__}} ({{loop.__file__}}) is not the "
             "one this script changes; start flower-supernode instead")


class _Time:
    """The `time` module, with the loop's idle poll and reply checks shortened."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        time.sleep(POLL if seconds == 3 else 0.05 if seconds == 0.5 else seconds)


loop.time = _Time()

# the heartbeat interval this SuperNode declares (Flower: 30 s): the SuperLink counts it offline 2
# intervals after its last heartbeat, and heartbeats go every (interval - 5 s) * 0.8
HEARTBEAT = {heartbeat!r}
# Flower's SuperNode gives up on an HTTP 500 (or 408, 429) from the SuperLink (its database locked, a
# proxy's answer) when it pulls: its loop ends, and the process stays up on its Runtime API thread, out
# of the federation for good; its heartbeat thread ends on such an answer too. dpfl/flower/retries.py
# retries them (for up to retries.PATIENCE s in a row) and keeps the heartbeat going; a SuperNode whose
# loop ends all the same ends its process (code 75, below)
import flwr.supercore.heartbeat as heartbeat  # noqa: E402
import flwr.supernode.fleet_http_connection as fleet  # noqa: E402

try:
    from dpfl.flower import retries  # noqa: E402
except ImportError as e:
    sys.exit(f"dpfl-supernode: this Python ({{sys.executable}}) cannot import dpfl.flower.retries ({{e}}): "
             "write the script with the dpfl that runs it (dpfl flower launcher)")


with open(fleet.__file__, encoding="utf-8") as f:
    text = f.read()
try:
    if not (text.count("HeartbeatSender(send_node_heartbeat)") == 1
            and text.count("os.kill(os.getpid(), signal.SIGINT)") == 1
            and text.count("retry_invoker = make_simple_http_retry_invoker()") == 1
            and text.count("make_simple_http_retry_invoker") == 2 and text.count("log(ERROR, exc)") == 1
            and fleet.HeartbeatSender is heartbeat.HeartbeatSender):
        raise retries.FlowerChanged(f"the retries of Flower {{flwr.__version__}} are not the ones dpfl changes")
    retries.check()
except retries.FlowerChanged as e:
    sys.exit(f"dpfl-supernode: {{e}}; start flower-supernode instead")
fleet.make_simple_http_retry_invoker = retries.patient_invoker
retries.steady_heartbeats()
if HEARTBEAT != 30:
    import flwr.common.constant as constant

    with open(heartbeat.__file__, encoding="utf-8") as f:
        beat = f.read().count("HEARTBEAT_DEFAULT_INTERVAL - HEARTBEAT_CALL_TIMEOUT")
    with open(fleet.__file__, encoding="utf-8") as f:
        said = f.read().count("heartbeat_interval=HEARTBEAT_DEFAULT_INTERVAL")
    if not (beat == 1 and said == 2 and fleet.HEARTBEAT_DEFAULT_INTERVAL == heartbeat.HEARTBEAT_DEFAULT_INTERVAL == 30
            and max(constant.HEARTBEAT_MIN_INTERVAL, heartbeat.HEARTBEAT_CALL_TIMEOUT) <= HEARTBEAT
            and HEARTBEAT <= constant.HEARTBEAT_MAX_INTERVAL):
        sys.exit(f"dpfl-supernode: the heartbeat of Flower {{flwr.__version__}} is not the one this script "
                 "changes; start flower-supernode instead")
    fleet.HEARTBEAT_DEFAULT_INTERVAL = heartbeat.HEARTBEAT_DEFAULT_INTERVAL = HEARTBEAT

FORK_SERVER = {server!r}  # dpfl's fork server for this SuperNode's ClientApps (None: none)


def sweep(tmp):
    # this user's directories dpfl-fork-PID-* whose SuperNode PID is gone, left by a fork server killed
    # with SIGKILL (one that sees its SuperNode end removes its own): removed only when they hold
    # nothing but a socket no server answers on, or nothing; one odd entry never stops the SuperNode's start
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        try:
            pid = name.split("-")[2] if name.startswith("dpfl-fork-") and name.count("-") >= 3 else ""
            if not (pid.isascii() and pid.isdigit() and 0 < int(pid) < 1 << 22):
                continue
            try:
                os.kill(int(pid), 0)
                continue  # alive (or its pid reused: left alone)
            except ProcessLookupError:
                pass
            path = os.path.join(tmp, name)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                held = os.listdir(fd)
                if os.stat(fd).st_uid != os.getuid() or held not in ([], ["s"]):
                    continue
                if held and not stat.S_ISSOCK(os.stat("s", dir_fd=fd, follow_symlinks=False).st_mode):
                    continue
                if held:
                    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        probe.connect(os.path.join(path, "s"))
                        continue  # a server answers (its SuperNode in another pid namespace): kept
                    except OSError:
                        pass
                    finally:
                        probe.close()
                    os.unlink("s", dir_fd=fd)
            finally:
                os.close(fd)
            os.rmdir(path)
        except Exception:  # noqa: BLE001
            continue


def own_superexec():
    # Flower starts `flower-superexec` by name, and it starts `flwr-clientapp` by name: both must be the
    # imported flwr's, run by this Python (a pyenv shim found first runs another environment's and puts
    # its bin first on PATH)
    from importlib import metadata

    dist = metadata.distribution("flwr")
    found = [os.path.normpath(str(dist.locate_file(f))) for f in dist.files or () if f.name == "flower-superexec"]
    script = next((f for f in found if os.path.isfile(f)), None)
    python = None
    if script is not None:
        with open(script, "rb") as f:
            head = f.readline().split()
        if len(head) == 1 and head[0].startswith(b"#!") and os.path.basename(head[0]).startswith(b"python"):
            python = os.fsdecode(head[0][2:])  # pip's line for a plain path (others: cannot tell, kept)
    if script is None or (python is not None and os.path.dirname(python) != os.path.dirname(sys.executable)):
        what = "has no flower-superexec" if script is None else f"has {{script}}, which runs {{python}}"
        sys.exit(f"dpfl-supernode: the flwr this Python ({{sys.executable}}) imports {{what}}: the SuperNode would "
                 "start another environment's SuperExec, whose ClientApps do not run this dpfl; install Flower's "
                 f"commands for this Python: {{sys.executable}} -m pip install --force-reinstall --no-deps "
                 f"flwr=={{flwr.__version__}}")
    here = os.path.realpath(os.path.dirname(script))
    mine = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PATH", os.defpath).split(os.pathsep)
    first = [d for d in path if d and os.path.realpath(d) == mine][:1]  # dpfl's flwr-clientapp stays first
    rest = [d for d in path if not d or os.path.realpath(d) not in (mine, here)]
    os.environ["PATH"] = os.pathsep.join(first + [here] + rest)


own_superexec()
os.environ.pop("{env}", None)
if FORK_SERVER and sys.platform.startswith("linux"):  # fork, SO_PEERCRED
    sweep(tempfile.gettempdir())
    where = os.path.join(tempfile.mkdtemp(prefix=f"dpfl-fork-{{os.getpid()}}-"), "s")  # only this user can enter
    if len(where) > 100 or not os.path.isfile(FORK_SERVER):  # sun_path: 108 bytes
        os.rmdir(os.path.dirname(where))
        print(f"dpfl-supernode: no fork server ({{FORK_SERVER}} missing, or TMPDIR too long for a socket's path)",
              file=sys.stderr, flush=True)
    else:
        subprocess.Popen([sys.executable, "-P", FORK_SERVER, where, str(os.getpid())], stdin=subprocess.DEVNULL)
        os.environ["{env}"] = where  # the SuperExec, and the flwr-clientapp it starts, inherit it

from flwr.supernode.cli import flower_supernode  # noqa: E402

try:
    flower_supernode()  # Flower's own exits (a signal, a refused start) end it here with their codes
    # its loop ended on an error it logged above, and its Runtime API thread would keep this process up
    retries.say("dpfl-supernode: the SuperNode left the federation on the error above; exiting with code 75, "
                "to be started again")
except SystemExit:
    raise
except BaseException:  # noqa: BLE001 (an error past Flower's own handling: the same thread would hang)
    import traceback

    traceback.print_exc()
    retries.say("dpfl-supernode: the SuperNode ended on the error above; exiting with code 75, to be started again")
try:
    sys.stdout.flush()
except Exception:  # noqa: BLE001
    pass
os._exit(75)  # EX_TEMPFAIL
'''


def _safe_parent(p: Path) -> bool:
    """Nobody but this user (or root) can rename or replace what `p` holds."""
    st = p.stat()
    return st.st_uid in (os.getuid(), 0) and (not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX))


def _own_dir(directory: str | Path) -> Path:
    """`directory` resolved, created 0700: it must belong to this user and be closed to others, and so
    must every folder above it (or be root's, or sticky like /tmp): what it holds is executed."""
    if any(c.isspace() for c in sys.executable):
        raise ConfigError(f"this Python's path ({sys.executable}) holds a space, which a #! line cannot: "
                          "use Flower's own commands (--launcher flower --node-poll 3)")
    given = Path(directory).absolute()
    if given.is_symlink():
        raise ConfigError(f"{given} is a symbolic link: give the directory itself (Flower runs what it holds)")
    given.mkdir(mode=0o700, parents=True, exist_ok=True)
    d = given.resolve()
    st = d.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ConfigError(f"{d} must belong to this user and be writable by no one else (Flower runs what it "
                          f"holds); it is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}")
    for parent in d.parents:
        if not _safe_parent(parent):
            raise ConfigError(f"{parent}, above {d}, may be changed by other users (owner uid "
                              f"{parent.stat().st_uid}, mode {oct(parent.stat().st_mode & 0o7777)}): they could "
                              "replace what Flower runs; choose a directory under one only you can change")
    return d


def _refuse_foreign(path: Path) -> None:
    """ConfigError if `path` exists and dpfl did not write it (it is never replaced)."""
    if path.is_symlink() or path.exists():
        head = b""
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                head = f.read(512)
        if MARK.encode() not in head:
            raise ConfigError(f"{path} exists and was not written by dpfl: not replacing it (choose another directory)")


def _put(d: Path, name: str, text: str) -> Path:
    """Write `d/name` (0700) in one rename; a file there that dpfl did not write is left alone."""
    path, tmp = d / name, d / f".{name}.{os.getpid()}.tmp"
    _refuse_foreign(path)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o700)  # whatever the umask
    os.replace(tmp, path)
    return path


def write(directory: str | Path) -> Path:
    """Write `directory/flwr-clientapp` (mode 0700; the directory is created 0700 and must belong
    to this user and be closed to others: Flower executes what it finds there). Returns the file."""
    return _put(_own_dir(directory), NAME, SCRIPT.format(python=sys.executable, mark=MARK, full=FULL, env=FORK_ENV))


def check_poll(poll: float) -> float:
    lo, hi = POLL_RANGE
    if not (lo <= poll < hi):  # also refuses NaN
        raise ConfigError(f"the SuperNode poll must be at least {lo} s and under Flower's own {hi:g} s, got {poll}")
    return float(poll)


POLL_HELP = ("the SuperNodes' idle seconds between pulls from the SuperLink: under 3, they run as dpfl-supernode "
             "(Flower's SuperNode with that poll, `dpfl flower launcher --node-poll`); 3: Flower's own flower-supernode")


LAUNCHERS = ("fork", "dpfl", "flower")
LAUNCHER_HELP = ("what starts each ClientApp process: fork (dpfl's flwr-clientapp, run by a fork of dpfl's fork "
                 "server beside each SuperNode; needs --node-poll under 3) | dpfl (dpfl's flwr-clientapp, a new "
                 "Python each message) | flower (Flower's own); default: fork, or dpfl with --node-poll 3")


def launcher_of(name: str | None, node_poll: float | None) -> str:
    """A --launcher value, checked against the SuperNodes' poll (None: Flower's flower-supernode).
    None: fork where the SuperNodes are dpfl-supernode (which starts the fork server), else dpfl."""
    if name is None:
        return "dpfl" if node_poll is None else "fork"
    if name not in LAUNCHERS:
        raise ConfigError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {name!r}")
    if name == "fork" and node_poll is None:
        raise ConfigError("--launcher fork needs dpfl-supernode (it starts the fork server): give --node-poll "
                          "under 3, or --launcher dpfl with Flower's flower-supernode")
    return name


def node_poll_of(seconds: float) -> float | None:
    """A --node-poll value: None for Flower's own 3 s, else the checked poll."""
    return None if seconds == FLOWER_POLL else check_poll(seconds)


def check_heartbeat(seconds: float) -> float:
    """A SuperNode's heartbeat interval within the SuperLink's bounds."""
    lo, hi = HEARTBEAT_RANGE
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not lo <= seconds <= hi:
        raise ConfigError(f"a SuperNode's heartbeat interval must be {lo:g} to {hi:g} s (the SuperLink's bounds; "
                          f"Flower's: {FLOWER_HEARTBEAT:g} s), got {seconds!r}")
    return float(seconds)


def write_both(directory: str | Path, poll: float, fork: bool = True,
               heartbeat: float = FLOWER_HEARTBEAT) -> tuple[Path, Path]:
    """`write` and `write_supernode`, each file checked before either is written."""
    poll, heartbeat = check_poll(poll), check_heartbeat(heartbeat)
    d = _own_dir(directory)
    for name in (NAME, SUPERNODE):
        _refuse_foreign(d / name)
    return write(d), write_supernode(d, poll, fork, heartbeat)


def write_supernode(directory: str | Path, poll: float, fork: bool = True,
                    heartbeat: float = FLOWER_HEARTBEAT) -> Path:
    """Write `directory/dpfl-supernode`: `flower-supernode` idle `poll` s between pulls, declaring a
    `heartbeat` s heartbeat interval, which starts dpfl's fork server for its ClientApps if `fork`
    (same directory rules as `write`). Returns the file."""
    poll, heartbeat = check_poll(poll), check_heartbeat(heartbeat)
    server = str(FORK_SERVER) if fork else None
    text = SUPERNODE_SCRIPT.format(python=sys.executable, mark=MARK, poll=poll, server=server, env=FORK_ENV,
                                   heartbeat=int(heartbeat) if heartbeat.is_integer() else heartbeat)
    return _put(_own_dir(directory), SUPERNODE, text)


def path_with(directory: str | Path, path: str | None) -> str:
    """PATH with `directory` first (an unset PATH: the system's default after it)."""
    return os.pathsep.join([str(Path(directory).resolve()), path or os.defpath])
