"""A federation on this machine: one SuperLink, N SuperNodes and `flwr run`, over loopback.

    with LocalFederation(workdir, nodes=3, tls=True) as fed:
        fed.run(app_dir, timeout=600)

Each component is its own process, started exactly as the documented commands start them
(`commands()` lists them); Flower's telemetry and update check are switched off, and the
SuperNodes find dpfl's quicker `flwr-clientapp` first on their PATH (`dpfl.flower.launcher`,
written to `workdir/bin`); with `node_poll`, they run as `workdir/bin/dpfl-supernode` (Flower's
SuperNode, idle `node_poll` s between pulls instead of 3 s). On exit every
process is stopped, together with the processes Flower started under it (SuperExec, ServerApp,
ClientApps): first SIGTERM, then SIGKILL after a grace period. Logs go to `workdir/logs`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Self

from dpfl.errors import ConfigError, DpflError
from dpfl.flower import certs
from dpfl.flower import launcher as quick_launch
from dpfl.flower.forkserver import alive
from dpfl.flower.progress import Echo

CONNECTION = "dpfl-local"
# Flower's own settings: no telemetry, no update check, and the SuperExec looks for new tasks every
# 0.1 s instead of every 1 s (a task is a ServerApp or ClientApp process to launch).
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
              "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


class FederationError(DpflError, RuntimeError):
    """A local federation component failed to start or a run failed."""


_GIVEN: set[int] = set()  # ports this process handed out (a SuperNode binds its port seconds later)


def _ephemeral() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of bind to port 0); where
    it cannot be read, the widest usual one (Linux 32768-60999, macOS and Windows 49152-65535)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 65535


def free_port() -> int:
    """A port free on 127.0.0.1 now, not handed out before by this process, outside the ephemeral
    range where there is room: a port from bind to port 0 can be taken, before its component binds
    it, by any outgoing connection (Flower's HTTP polls open many), and a SuperNode whose Runtime API
    cannot bind exits with code 1."""
    import secrets

    low, high = _ephemeral()
    spans = [(r0, r1) for r0, r1 in ((10000, low - 1), (high + 1, 65535)) if r1 - r0 >= 1000]
    total = sum(r1 - r0 + 1 for r0, r1 in spans)
    for _ in range(200 if spans else 0):
        port = secrets.randbelow(total)  # uniform over both spans
        for r0, r1 in spans:
            if port <= r1 - r0:
                port += r0
                break
            port -= r1 - r0 + 1
        if port not in _GIVEN and _bindable(port):
            _GIVEN.add(port)
            return port
    for _ in range(200):  # no room outside (or all taken): the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise FederationError("found no free port on 127.0.0.1")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/pid/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:  # bytes: a command name need not be UTF-8 (the fields after it are ASCII)
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _processes() -> dict[int, list[str]]:
    """pid → `_stat` of every process (Linux; elsewhere none)."""
    pids = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()] if Path("/proc").is_dir() else []
    return {pid: f for pid in pids if (f := _stat(pid))}


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for pid, f in _processes().items():
        kids.setdefault(int(f[1]), []).append(pid)
    return kids


def descendants(pids: list[int]) -> list[int]:
    """`pids` and every process below them (Linux /proc; elsewhere just `pids`)."""
    kids, out, todo = _children(), [], list(pids)
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(kids.get(p, []))
    return out


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot; Linux), None if it is gone."""
    f = _stat(pid)
    return int(f[19]) if f else None


def session_members(leaders: dict[int, int | None]) -> list[int]:
    """The processes in the sessions of `leaders` (pid → its start time): what a session leader
    started stays in its session after the leader dies (Linux; elsewhere none). A leader's pid
    now held by a later process is someone else's session, skipped."""
    ours = {pid for pid, t in leaders.items() if start_time(pid) in (None, t)}
    return [pid for pid, f in _processes().items() if int(f[3]) in ours and f[0] != "Z"] if ours else []


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of `pids` and of the children they have waited for (Linux)."""
    total = 0
    for pid in pids:
        if (f := _stat(pid)) is None:
            continue
        total += sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def stop_processes(procs: list[subprocess.Popen], grace: float = 5.0, also: list[int] | None = None) -> None:
    """SIGTERM `procs`, the processes `also` and all their descendants, then SIGKILL whatever is
    left after `grace` s."""
    pids = descendants([p.pid for p in procs if p.poll() is None] + (also or []))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        pids = [pid for pid in pids if _alive(pid)]
        if not pids:
            return


def _alive(pid: int) -> bool:
    """`forkserver.alive` (a zombie has ended), for a process this user may signal."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return alive(pid)


# Flower 1.41 gives a launched ServerApp/ClientApp process HEARTBEAT_DEFAULT_INTERVAL = 30 s from its launch
# to its first heartbeat; a process too starved of CPU to import Flower in time is refused ("Runtime
# task-token authentication failed") and launched again, with no end.
TOKEN_WINDOW_S = 30
REFUSED_LAUNCHES = 5  # 30–60 s each: a passing load spike gets a few tries
_REFUSED = "/v1/runtime/send-task-heartbeat][ApiError:1008] Runtime task-token authentication failed"


def refused_launches(logs: Path) -> int:
    """How many app processes the federation's SuperLink and SuperNodes refused for a late first heartbeat."""
    n = 0
    for f in Path(logs).glob("super*.log"):
        try:
            n += f.read_text(errors="replace").count(_REFUSED)
        except OSError:
            pass
    return n


class LocalFederation:
    """SuperLink + `nodes` SuperNodes on 127.0.0.1 (free ports), optionally with TLS and
    SuperNode authentication. `node_config(i)` adds keys to node i's --node-config (its
    partition-id = i and num-partitions = nodes are always set)."""

    def __init__(self, workdir: str | Path, nodes: int, *, tls: bool = False, auth: bool = False,
                 seeded: bool = False, node_config: dict[int, dict[str, object]] | None = None,
                 launcher: str | None = None, node_poll: float | None = quick_launch.LOCAL_POLL, log=print):
        if nodes < 1:
            raise ConfigError(f"a federation needs at least one SuperNode, got nodes = {nodes}")
        if auth and not tls:
            raise ConfigError("SuperNode authentication needs TLS (Flower refuses it over an insecure channel)")
        self.dir = Path(workdir).resolve()  # the SuperNodes run what bin/ holds: by a path without links
        self.n, self.tls, self.auth, self.seeded = nodes, tls, auth, seeded
        self.node_poll = None if node_poll is None else quick_launch.check_poll(node_poll)
        self.launcher = launcher = quick_launch.launcher_of(launcher, self.node_poll)
        self.extra = node_config or {}
        self.log = log
        self.procs: list[subprocess.Popen] = []
        self._started: dict[int, int | None] = {}  # pid → start time, of the processes started here not yet ended
        self._names: dict[int, tuple[str, int]] = {}  # pid → its log's name, and where its part begins
        self.port = 0
        self.cpu_seconds = 0.0  # CPU time of all components, measured at stop()
        self._cpu_done = 0.0  # of `flwr run` processes that have ended
        self.env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.dir / "flwr-home")}
        self.env.pop(quick_launch.FORK_ENV, None)  # only a SuperNode's own fork server is used
        if launcher != "flower":  # the SuperNodes find dpfl's quicker `flwr-clientapp` first (dpfl.flower.launcher)
            self.env["PATH"] = quick_launch.path_with(self.dir / "bin", os.environ.get("PATH"))
        self.nodes: dict[int, subprocess.Popen] = {}  # client id → its SuperNode
        self.link: subprocess.Popen | None = None  # the SuperLink

    # ---- commands -------------------------------------------------------------------
    @property
    def certs_dir(self) -> Path:
        return self.dir / "certs"

    def _tls_args(self, server: bool) -> list[str]:
        c = self.certs_dir
        if not self.tls:
            return ["--insecure"]
        if server:
            return ["--ssl-ca-certfile", str(c / certs.CA_CERT), "--ssl-certfile", str(c / certs.SERVER_CERT),
                    "--ssl-keyfile", str(c / certs.SERVER_KEY)]
        return ["--root-certificates", str(c / certs.CA_CERT)]

    def node_config(self, i: int) -> str:
        items: dict[str, object] = {"partition-id": i, "num-partitions": self.n}
        if self.seeded:
            items["dpfl-seeded"] = True
        if self.auth:  # the registered key also signs the secure-aggregation rounds (docs/threat-model.md)
            items["signing-key"] = str(self.certs_dir / f"node-{i}")
            items["peers"] = str(self.certs_dir / certs.PEERS)
        items.update(self.extra.get(i, {}))
        return " ".join(f"{k}={_toml(v)}" for k, v in items.items())

    def superlink_command(self) -> list[str]:
        cmd = ["flower-superlink", *self._tls_args(True), "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation", "--database", str(self.dir / "superlink.db")]
        return cmd + (["--enable-supernode-auth"] if self.auth else [])

    def supernode_command(self, i: int, runtime_port: int) -> list[str]:
        exe = "flower-supernode" if self.node_poll is None else str(self.dir / "bin" / quick_launch.SUPERNODE)
        cmd = [exe, *self._tls_args(False), "--superlink", f"127.0.0.1:{self.port}",
               "--port", str(runtime_port), "--node-config", self.node_config(i)]
        if self.auth:
            cmd += ["--auth-supernode-private-key", str(self.certs_dir / f"node-{i}")]
        return cmd

    def run_command(self, app_dir: str | Path, run_config: str | None = None) -> list[str]:
        cmd = ["flwr", "run", str(Path(app_dir).absolute()), CONNECTION, "--stream"]
        return cmd + (["--run-config", run_config] if run_config else [])

    def commands(self, app_dir: str | Path = "APP_DIR") -> list[str]:
        """The shell commands this federation runs, in order (for docs and logs)."""
        lines = [shlex.join(self.superlink_command())]
        if self.auth:
            lines += [shlex.join(["flwr", "supernode", "register", str(self.certs_dir / f"node-{i}.pub"), CONNECTION])
                      for i in range(self.n)]
        lines += [shlex.join(self.supernode_command(i, 9094 + i)) for i in range(self.n)]
        return lines + [shlex.join(self.run_command(app_dir))]

    # ---- lifecycle ------------------------------------------------------------------
    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            at = out.tell()
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.dir,
                                 start_new_session=True)  # its own session: see `session_members`
        self.procs.append(p)
        self._started[p.pid] = start_time(p.pid)
        self._names[p.pid] = (name, at)
        return p

    def _leftovers(self, pids: list[int]) -> list[int]:
        """The processes still running in the sessions of the processes `pids` started here."""
        return session_members({pid: self._started.get(pid) for pid in pids})

    def _end(self, p: subprocess.Popen) -> int:
        """For a process started here that has ended: stop what it left in its session, and forget
        it (its pid may be reused). Returns how many processes were left."""
        left = self._leftovers([p.pid])
        stop_processes([], grace=2.0, also=left)
        self._started.pop(p.pid, None)
        return len(left)

    def _write_connection(self) -> None:
        home = self.dir / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        conn = f'address = "127.0.0.1:{self.port}"\n'
        conn += f'root-certificates = "{self.certs_dir / certs.CA_CERT}"\n' if self.tls else "insecure = true\n"
        (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n{conn}')

    def _wait_healthy(self, proc: subprocess.Popen, timeout: float) -> None:
        scheme = "https" if self.tls else "http"
        ctx = ssl.create_default_context(cafile=str(self.certs_dir / certs.CA_CERT)) if self.tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FederationError(f"flower-superlink exited with code {proc.returncode}; see "
                                      f"{self.dir / 'logs' / 'superlink.log'}")
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health", timeout=1, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise FederationError(f"the SuperLink did not answer /health within {timeout:.0f} s")

    def start(self, timeout: float = 60.0) -> LocalFederation:
        self.write_bin()
        if self.tls:
            certs.make_tls(self.certs_dir)
        if self.auth:
            certs.make_node_keys(self.certs_dir, self.n)
        self.port = free_port()
        self._write_connection()
        for f in self.dir.glob("superlink.db*"):  # a new SuperLink: no nodes or runs of an earlier one
            f.unlink()
        self.link = self._spawn(self.superlink_command(), "superlink")
        self._wait_healthy(self.link, timeout)
        if self.auth:
            for i in range(self.n):
                pub = self.certs_dir / f"node-{i}.pub"
                res = subprocess.run(["flwr", "supernode", "register", str(pub), CONNECTION], env=self.env,
                                     cwd=self.dir, capture_output=True, text=True, timeout=timeout, check=False)
                if res.returncode:
                    raise FederationError(f"registering {pub.name} failed: {res.stdout}{res.stderr}")
        for i in range(self.n):
            self.start_node(i, wait=False)  # a first start: nothing to wait out (run() checks they are up)
        self.log(f"federation up: SuperLink 127.0.0.1:{self.port} ({'TLS' if self.tls else 'insecure'}"
                 f"{', node auth' if self.auth else ''}), {self.n} SuperNodes; logs in {self.dir / 'logs'}")
        return self

    def write_bin(self) -> None:
        """dpfl's flwr-clientapp and dpfl-supernode (a 10 s heartbeat: a killed site is offline 20 s
        after its last one) in bin/, as this federation runs them."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.launcher != "flower":
            quick_launch.write(self.dir / "bin")
        if self.node_poll is not None:
            quick_launch.write_supernode(self.dir / "bin", self.node_poll, fork=self.launcher == "fork",
                                         heartbeat=quick_launch.LOCAL_HEARTBEAT)

    def start_node(self, i: int, wait: bool = True, deadline: float = 180.0) -> None:
        """Start client i's SuperNode (again, after `kill_node`: with the same key, an empty state).
        A SuperNode restarted while the SuperLink still counts its killed predecessor as online is
        refused activation and exits (Flower's exit code 305), possibly after many seconds of
        connection retries: it is started again, every few seconds, until one logs its node id
        (activated) or `deadline` s have passed (wait = False: start once and return)."""
        if i in self.nodes and self.nodes[i].poll() is None:
            raise FederationError(f"the SuperNode of client {i} is running")
        log = self.dir / "logs" / f"supernode-{i}.log"
        end = time.monotonic() + deadline
        while True:
            start = log.stat().st_size if log.exists() else 0
            p = self._spawn(self.supernode_command(i, free_port()), f"supernode-{i}")
            self.nodes[i] = p
            if not wait:
                return
            while p.poll() is None:
                with open(log, "rb") as f:
                    f.seek(start)
                    if b"SuperNode ID:" in f.read():
                        return  # activated
                if time.monotonic() > end:
                    raise FederationError(f"the SuperNode of client {i} was not activated within {deadline:.0f} s "
                                          f"(see logs/supernode-{i}.log)")
                time.sleep(0.5)
            self._end(p)  # Flower started its SuperExec before it was refused
            if time.monotonic() > end:
                raise FederationError(f"the SuperNode of client {i} exited with code {p.returncode} on every start "
                                      f"for {deadline:.0f} s (see logs/supernode-{i}.log)")
            time.sleep(3.0)

    def restart_superlink(self, timeout: float = 60.0) -> None:
        """kill -9 of the SuperLink, then start it again on its database (its state: registered
        keys, nodes, runs): the SuperNodes reconnect without registering again."""
        for pid in descendants([self.link.pid]):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.link.wait()
        self._end(self.link)
        self.link = self._spawn(self.superlink_command(), "superlink")
        self._wait_healthy(self.link, timeout)

    def kill_node(self, i: int) -> None:
        """kill -9 of client i's SuperNode and everything it started (its SuperExec, ClientApps)."""
        p = self.nodes[i]
        for pid in descendants([p.pid, *self._leftovers([p.pid])]):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        p.wait()
        self._end(p)

    def check_nodes(self) -> None:
        """A SuperNode that has ended (killed from outside, or failed): say so once, and stop what it
        left running. Flower's SuperExec outlives its killed SuperNode, polling a closed port, until
        someone waits for the SuperNode (then it takes ~17 s to leave)."""
        for i, p in sorted(self.nodes.items()):
            if p.pid not in self._started or p.poll() is None:
                continue
            last = self._last_line(p)  # before its leftovers, which write to the same log, are stopped
            n = self._end(p)
            left = f"; stopped {n} process{'es' if n > 1 else ''} it left running" if n else ""
            self.log(f"the SuperNode of client {i} exited with code {p.returncode}{left}"
                     f"{f': {last}' if last else ''} (see {self.dir / 'logs' / f'supernode-{i}.log'})")

    def _last_line(self, p: subprocess.Popen) -> str:
        """The last line process p wrote to its part of its log ("" if none)."""
        name, at = self._names.get(p.pid, ("", 0))
        try:
            with open(self.dir / "logs" / f"{name}.log", "rb") as f:
                f.seek(at)
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        lines = [x.strip() for x in lines if x.strip() and not x.startswith("For more information, visit:")]
        return lines[-1][:300] if lines else ""  # (Flower's exits end with a link to its exit-code page)

    def serverapps(self) -> list[int]:
        """The pids of the running ServerApp processes of this federation."""
        return [pid for pid in descendants([p.pid for p in self.procs if p.poll() is None])
                if "flwr-serverapp" in _cmdline(pid)]

    def run(self, app_dir: str | Path, timeout: float = 600.0, run_config: str | None = None, *,
            name: str = "run", watch: Callable[[str], None] | None = None) -> str:
        """`flwr run` the app and wait for the run to end; returns its streamed log (logs/NAME.log).
        `watch(log so far)` is called every 0.5 s while the run goes on (tests act on it)."""
        for p in [q for q in (self.link, *self.nodes.values()) if q is not None]:
            if p.poll() is not None:
                last = self._last_line(p)
                log = self.dir / "logs" / f"{self._names.get(p.pid, ('', 0))[0]}.log"
                raise FederationError(f"{shlex.join(p.args[:1])} exited with code {p.returncode} before the run"
                                      + (f": {last} (see {log})" if last else ""))
        log_path = self.dir / "logs" / f"{name}.log"
        log_path.unlink(missing_ok=True)
        before = _children_cpu()
        p = self._spawn(self.run_command(app_dir, run_config), name)
        deadline = time.monotonic() + timeout
        polls = 0
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise FederationError(f"the run did not finish within {timeout:.0f} s; see {log_path}")
            refused = refused_launches(self.dir / "logs") if polls % 10 == 0 else 0  # the logs every 5 s
            polls += 1
            if refused >= REFUSED_LAUNCHES:
                raise FederationError(
                    f"Flower refused {refused} app launches (\"Runtime task-token authentication failed\"): an "
                    f"app process must send its first heartbeat within {TOKEN_WINDOW_S} s of being launched, and "
                    "this machine is too loaded to start one that fast; see the logs in " + str(self.dir / "logs"))
            if watch is not None:
                watch(log_path.read_text(errors="replace"))
            self.check_nodes()
            time.sleep(0.5)
        self._cpu_done += _children_cpu() - before
        self._end(p)
        text = log_path.read_text(errors="replace")
        if p.returncode:
            raise FederationError(f"flwr run exited with code {p.returncode}:\n{text[-2000:]}")
        return text

    def stop(self) -> None:
        live = [p.pid for p in self.procs if p.poll() is None]
        self.cpu_seconds = cpu_seconds(descendants(live)) + self._cpu_done
        stop_processes(self.procs, also=self._leftovers(list(self._started)))
        self.procs.clear()
        self._started.clear()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children_cpu() -> float:
    """User + system time of this process's children that have been waited for (POSIX)."""
    try:
        import resource
    except ImportError:
        return 0.0
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


_ERROR_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ dpfl-error: (.*)$", re.MULTILINE)  # the ServerApp's own


def raise_if_unfinished(workdir: str | Path, log_text: str = "", rounds: int | None = None) -> dict:
    """The summary of the deployed run in `workdir/out`. FederationError, saying how to resume, if
    the ServerApp stopped before the end (no summary, or fewer rounds than planned and no stop
    reason); FederationError with the reason if every round aborted."""
    import json

    from dpfl.run.state import SUMMARY

    work = Path(workdir).absolute()
    out, logs = work / "out", work / "federation" / "logs"
    resume = f"resume it with `dpfl flower local --resume {work}`"
    error = next((m.group(1) for m in _ERROR_LINE.finditer(log_text)), None)
    if error is not None and not (out / SUMMARY).is_file():  # the ServerApp's one line (a config, data, ...)
        raise FederationError(f"the ServerApp stopped: {error} (logs: {logs})")
    if not (out / SUMMARY).is_file():
        tail = f"; the run's log ends with:\n{log_text[-3000:]}\n" if log_text else " "
        raise FederationError(f"the ServerApp stopped before the end of the run{tail}(logs: {logs}); {resume}")
    summary = json.loads((out / SUMMARY).read_text())
    if rounds is not None and summary.get("rounds_run", 0) < rounds and summary.get("stopped") is None:
        raise FederationError(f"the ServerApp stopped after round {summary.get('rounds_run')} of {rounds}; {resume}")
    if (summary.get("stopped") or "").startswith("all "):
        raise FederationError(f"{summary['stopped']} (logs: {logs})")
    return summary


def _was_reproducible(app_dir: Path) -> bool:
    """Whether the run written to `app_dir` was seeded (its resume must be too)."""
    import tomllib

    from dpfl.flower.appdir import PYPROJECT

    try:
        doc = tomllib.loads((app_dir / PYPROJECT).read_text())
        return bool(doc["tool"]["flwr"]["app"]["config"]["reproducible"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return False


def run_local(config_text: str | None, workdir: str | Path, *, tls: bool = True, auth: bool = False,
              reproducible: bool = False, data_paths: dict[int, str] | None = None,
              node_config: dict[int, dict[str, object]] | None = None, timeout: float = 1800.0,
              resume: bool = False, evaluation: str = "both", launcher: str | None = None,
              node_poll: float | None = quick_launch.LOCAL_POLL, log=print) -> dict:
    """Run a dpfl config on a local federation (one SuperNode per client) and tear it down.

    reproducible: seeded clients and server (the simulator's randomness: comparable with
    `dpfl run` bit for bit, and NOT private). data_paths: client id → its data file (else each
    client takes its partition of the configured dataset); node_config: more node config keys per
    client (test-path, ...). resume: continue the run in `workdir/out` from its checkpoint (the
    config is the run's own, `config_text` must be None or the same). launcher: what starts the
    ClientApps (fork, dpfl, flower; None: `dpfl.flower.launcher.launcher_of`). node_poll: the
    SuperNodes run as dpfl-supernode, idle that many s between pulls (None: Flower's 3 s). Returns the per-round
    metrics, the summary, the final model `w`, the wall and CPU seconds of the run, and the commands.
    """
    import json

    from dpfl.flower.appdir import write_app
    from dpfl.flower.client import parse_run_config
    from dpfl.run import checkpoint as ckpt
    from dpfl.run.state import CHECKPOINT, CONFIG, METRICS, SUMMARY

    work = Path(workdir).absolute()
    out = work / "out"
    if resume:
        if not (out / CONFIG).is_file():
            raise ConfigError(f"{work} holds no deployed run to resume (no {out / CONFIG})")
        config_text = (out / CONFIG).read_text()
        reproducible = _was_reproducible(work / "app")
    elif config_text is None:
        raise ConfigError("a local federation needs a config")
    cfg = parse_run_config(config_text)
    outside = sorted(set(node_config or {}) - set(range(cfg.data.n_clients)))
    if outside:
        raise ConfigError(f"node config for clients {outside}, but the run has data.n_clients = {cfg.data.n_clients} "
                          f"(clients 0..{cfg.data.n_clients - 1})")
    peers = work / "federation" / "certs" / certs.PEERS if auth else ""  # written when the federation starts
    app_dir = write_app(work / "app", config_text, out_dir=str(out), reproducible=reproducible,
                        timeout=min(timeout, 600.0), resume=resume, evaluation=evaluation, peers=str(peers))
    extra = {i: dict((node_config or {}).get(i, {})) for i in range(cfg.data.n_clients)}
    for i, p in (data_paths or {}).items():
        extra[i]["data-path"] = str(Path(p).absolute())
    fed = LocalFederation(work / "federation", cfg.data.n_clients, tls=tls, auth=auth, seeded=reproducible,
                          node_config=extra, launcher=launcher, node_poll=node_poll, log=log)
    (out / SUMMARY).unlink(missing_ok=True)  # the summary this run writes at its end
    t0 = time.perf_counter()
    with fed:
        t1 = time.perf_counter()
        echo = Echo(log)  # each round as it comes
        text = fed.run(app_dir, timeout=timeout, name="resume" if resume else "run", watch=echo)
        t2 = time.perf_counter()
        echo(text)  # the last rounds, streamed as the run ended
    summary = raise_if_unfinished(work, text, cfg.federation.rounds)
    metrics = [json.loads(line) for line in (out / METRICS).read_text().splitlines() if line]
    return {"metrics": metrics, "summary": summary,
            "w": ckpt.load(out / CHECKPOINT)["w"], "startup_seconds": t1 - t0,
            "run_seconds": t2 - t1, "total_seconds": time.perf_counter() - t0, "cpu_seconds": fed.cpu_seconds,
            "commands": fed.commands(app_dir), "logs": str(work / "federation" / "logs")}
