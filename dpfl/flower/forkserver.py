"""A fork server for the ClientApp processes Flower launches, one per message (Linux).

Flower's SuperExec starts the command `flwr-clientapp` for every message, and most of that launch is a
new Python importing Flower (about 1.3 s of CPU on a 2-core EPYC; three sites launch at once). Flower
1.41 has no way to keep a ClientApp alive between messages. `dpfl-supernode` (launcher.py) starts this
server beside the SuperNode: one process that imports Flower's `flwr-clientapp` module once and waits
on a Unix socket in a private directory. dpfl's `flwr-clientapp` script sends it its arguments,
working directory, environment and standard streams; the server forks, and the child runs Flower's own
`flwr_clientapp()` with them, as the launched process would have, and reports its exit status. Each
message still runs in a process of its own (a fork of one that has run nothing), so nothing carries
over between messages. Signals sent to the script are passed on to the child; if the script dies, the
child is sent SIGTERM. Where the server cannot be reached, the script runs Flower's function itself.

This file imports nothing of dpfl: the server is started by its path (`python -P FILE SOCKET PID`),
so that a ClientApp's own `import dpfl.flower` happens in the child, as in a launched process.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

ENV = "DPFL_FORK_SERVER"  # the socket's path, in the SuperNode's environment (its SuperExec's, its scripts')
STREAMS = 3  # stdin, stdout, stderr: passed with the request (SCM_RIGHTS)
MAX_REQUEST = 1 << 20  # bytes of a request: argv, cwd and environment as JSON
MAX_ARGS = 256
GRACE = 10.0  # s a fork may run on after its SuperExec is gone
WAKE = signal.SIGURG  # ignored by default; a fork's handler for it does nothing (_watch)
INT = struct.Struct("!i")  # the child's pid (0: it could not start; nothing ran), then its exit status:
# from the child, else (one that ended by os._exit or was killed by signal N) from the server, -N for a signal


def parse_request(data: bytes) -> tuple[list[str], str, dict[str, str]]:
    """(argv, cwd, env) from a request's JSON; ValueError naming what is wrong."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"a request must be UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict) or set(obj) != {"argv", "cwd", "env"}:
        raise ValueError("a request must be a JSON object with exactly the keys argv, cwd and env")
    argv, cwd, env = obj["argv"], obj["cwd"], obj["env"]
    if not (isinstance(argv, list) and 1 <= len(argv) <= MAX_ARGS and all(isinstance(a, str) for a in argv)):
        raise ValueError(f"argv must be a list of 1 to {MAX_ARGS} strings")
    if not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise ValueError("cwd must be an absolute path")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env must map strings to strings")
    if any(k == "" or "=" in k for k in env):
        raise ValueError("an environment variable's name must be non-empty and hold no '='")
    if any("\0" in s for s in [*argv, cwd, *env, *env.values()]):
        raise ValueError("a request's strings may hold no NUL character")
    return argv, cwd, env


def encode_request(argv: list[str], cwd: str, env: dict[str, str]) -> bytes:
    """The length-prefixed request `parse_request` reads (the script inlines the same two lines)."""
    data = json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode()
    return struct.pack("!I", len(data)) + data


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket `conn` (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _recv_exact(conn: socket.socket, n: int, head: bytes = b"") -> bytes:
    buf = bytearray(head)
    while len(buf) < n:
        chunk = conn.recv(min(1 << 16, n - len(buf)))
        if not chunk:
            raise ValueError(f"the request ended after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def receive(conn: socket.socket) -> tuple[list[str], str, dict[str, str], list[int]]:
    """One request from `conn`: (argv, cwd, env, fds). ValueError (fds closed) if it is not one."""
    data, fds, flags, _ = socket.recv_fds(conn, 1 << 16, STREAMS)
    try:
        if flags & socket.MSG_CTRUNC or len(fds) != STREAMS:
            raise ValueError(f"a request must carry exactly {STREAMS} file descriptors, got {len(fds)}")
        if len(data) < 4:
            raise ValueError("a request must start with its 4-byte length")
        (n,) = struct.unpack("!I", data[:4])
        if n > MAX_REQUEST:
            raise ValueError(f"a request of {n} bytes is over the {MAX_REQUEST}-byte limit")
        if len(data) > 4 + n:
            raise ValueError("bytes follow the request")
        argv, cwd, env = parse_request(_recv_exact(conn, 4 + n, data)[4:])
    except (ValueError, OSError):
        for fd in fds:
            os.close(fd)
        raise
    return argv, cwd, env, fds


def load_main():
    """Flower's `flwr_clientapp` function, loaded as dpfl's script loads it (without the package
    `flwr.supernode.cli`, whose __init__ imports the SuperNode's command)."""
    import importlib.util

    import flwr.supernode

    path = os.path.join(flwr.supernode.__path__[0], "cli", "flwr_clientapp.py")
    if not os.path.isfile(path):
        from flwr.supernode.cli import flwr_clientapp
        _preload()
        return flwr_clientapp
    spec = importlib.util.spec_from_file_location("_flwr_clientapp", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    _preload()
    return module.flwr_clientapp


def _preload() -> None:
    """What every ClientApp imports lazily: httpcore (and trio with it), when Flower's HTTP client
    to the SuperNode is built: 0.36 s of each fork's CPU on a 2-core EPYC."""
    try:
        import httpcore  # noqa: F401
    except ImportError:
        pass


def exit_status(code: object) -> int:
    """The status a process exiting by `sys.exit(code)` has (a message is printed to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _parent_pid(argv: list[str]) -> int | None:
    """The SuperExec's pid that Flower passes as `--parent-pid N`, if it does."""
    try:
        return int(argv[argv.index("--parent-pid") + 1])
    except (ValueError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether process `pid` runs (one of another user's counts). A zombie has ended: only its
    parent's wait is missing, and a PID 1 that does not reap (a container's own command) keeps it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return not os.path.isdir("/proc")  # gone since the kill (Linux), or no /proc to tell


def _wake(*_) -> None:
    """WAKE's handler: nothing. Its delivery interrupts the main thread's wait, and Python then runs the
    handlers pending."""


def _watch(conn: socket.socket, parent: int | None, poll: float = 0.5, grace: float = GRACE) -> None:
    """SIGTERM this process once the script that asked for it is gone (its end of `conn` closes).
    Once the SuperExec (`parent`) is gone, Flower's own monitor raises SIGINT in its monitor thread
    only, which a main thread blocked in a wait without a timeout (a task pull from a SuperNode killed
    mid-message) never sees. So from then on this thread sends the whole process WAKE every `poll` s:
    the main thread's wait is interrupted and Python runs Flower's pending handler (its graceful exit),
    which a second SIGINT would cut short. A fork still running `grace` s later is killed (SIGKILL):
    a ClientApp that ignores SIGINT, or one still in its exit path then (its status is then -9: the
    SuperExec that would read it is gone)."""
    gone = None
    while True:
        try:
            ready, _, _ = select.select([conn], [], [], poll)
            if ready and not conn.recv(64):
                break
        except OSError:
            break
        if gone is None and parent is not None and not alive(parent):
            gone = time.monotonic()
        if gone is not None:
            if time.monotonic() - gone > grace:
                os.kill(os.getpid(), signal.SIGKILL)  # its script ends by SIGKILL too (the server reports it)
            os.kill(os.getpid(), WAKE)  # process-directed: it reaches the main thread
    os.kill(os.getpid(), signal.SIGTERM)


def _child(conn: socket.socket, argv: list[str], cwd: str, env: dict[str, str], fds: list[int], main,
           grace: float = GRACE) -> None:
    """In the forked child: become the launched process, run Flower's function, report, exit."""
    code = 1
    try:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(WAKE, _wake)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, STREAMS) for fd in fds]  # none of them 0-2 while 0-2 are set
            for fd in fds:
                os.close(fd)
            for target, fd in enumerate(high):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            sys.argv = list(argv)
        except Exception as e:  # noqa: BLE001 - nothing ran: the script runs Flower's function itself
            print(f"dpfl fork server: could not start a ClientApp: {e!r}", file=sys.stderr, flush=True)
            conn.sendall(INT.pack(0))  # where the pid would be (the server's status for it comes after)
            return
        conn.sendall(INT.pack(os.getpid()))
        threading.Thread(target=_watch, args=(conn, _parent_pid(argv)), kwargs={"grace": grace}, daemon=True).start()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = exit_status(e.code)
        except BaseException:  # noqa: BLE001 - what an uncaught exception does to a process
            import traceback

            traceback.print_exc()
            code = 1
        # then what a process's normal end does: wait for its other threads, run its exit functions
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        for sig in (signal.SIGTERM, signal.SIGINT):  # done: the script's or SuperExec's end (_watch) is no news now
            signal.signal(sig, signal.SIG_IGN)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            conn.sendall(INT.pack(code))
        except OSError:
            pass
    finally:
        os._exit(code)


def _reap(children: dict[int, socket.socket]) -> None:
    """Wait for ended children; send each one's script its exit status (-N for signal N, so that the
    script ends by it too), which it reads where the child sent none (Flower's `os._exit` after a
    graceful exit's timeout, a signal); then close the server's end of the child's connection."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            conn.sendall(INT.pack(os.waitstatus_to_exitcode(status)))  # -N if killed by signal N
        except OSError:  # the script is gone
            pass
        conn.close()


def serve(path: str, parent: int, main=None, poll: float = 0.5, grace: float = GRACE) -> None:
    """Serve requests on the Unix socket `path` until process `parent` is gone (or SIGTERM); a fork
    whose SuperExec is gone is woken for Flower's exit, then killed `grace` s later if still running."""
    main = main or load_main()
    me = os.getpid()
    uid = os.getuid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    children: dict[int, socket.socket] = {}  # running forks: the server's end of their script's connection

    def stop(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        listener.bind(path)  # after the imports: a script that connects finds a ready server
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.settimeout(poll)
        gc.collect()
        gc.freeze()  # the children share the imported modules' pages: the collector leaves them untouched
        sys.stdout.flush()
        sys.stderr.flush()  # nothing buffered is copied into the children
        while os.getppid() == parent:
            _reap(children)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:  # out of descriptors, a caller gone: the next one may be served
                print(f"dpfl fork server: accept failed: {e}", file=sys.stderr, flush=True)
                time.sleep(poll)
                continue
            try:
                conn.settimeout(5.0)
                if peer_uid(conn) != uid:
                    raise ValueError("a process of another user connected")
                argv, cwd, env, fds = receive(conn)
                conn.settimeout(None)
            except (ValueError, OSError) as e:
                print(f"dpfl fork server: refused a request: {e}", file=sys.stderr, flush=True)
                conn.close()
                continue
            try:
                pid = os.fork()
            except OSError as e:  # the script sees its connection close before a pid, and runs Flower itself
                print(f"dpfl fork server: fork failed: {e}", file=sys.stderr, flush=True)
                pid = -1
            if pid == 0:
                listener.close()
                for other in children.values():  # the other scripts' connections are not this fork's
                    other.close()
                _child(conn, argv, cwd, env, fds, main, grace)
            for fd in fds:
                os.close(fd)
            if pid > 0:
                children[pid] = conn  # kept until the child is reaped: a signal that kills it is reported
            else:
                conn.close()
    finally:
        if os.getpid() == me:
            listener.close()
            try:
                os.unlink(path)
                os.rmdir(os.path.dirname(path))
            except OSError:
                pass


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: forkserver.py SOCKET PARENT_PID")
    try:
        serve(sys.argv[1], int(sys.argv[2]))
    except KeyboardInterrupt:
        pass
