"""A site's training process, kept alive between Flower messages.

Flower 1.41 launches one ClientApp process per message (its warm executors serve agent, model
and connector apps, not ClientApps), so every training message would import torch (2 s of CPU)
and load the site's data and model again. The ClientApp of a message that trains (hello, train,
statistic, evaluate) instead forwards it to this site's worker: one process per (run, node),
started by the first such message, serving messages one at a time over a Unix socket and
caching what does not change during a run (torch, the site's data). The key-sharing, consistency
and unmasking phases never reach it: their ClientApps import neither torch nor scipy.

Nothing secret lives in the worker between messages: the node's state (its secret, the encoded
row) travels with each message and back, and stays in the SuperNode as before. The socket lies in
a directory only this user can open (`/tmp/dpfl-<uid>`, mode 0700, checked), and the worker
answers only this user's processes (SO_PEERCRED). Records cross as Flower's own protobuf
(`recorddict_to_proto`); nothing is unpickled. The worker exits when the ClientApp's parent is gone
(the SuperNode's SuperExec, or its fork server: each ends with the SuperNode), or after `IDLE_S`
without a message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto

from dpfl import errors
from dpfl.errors import ConfigError, ProtocolError
from dpfl.flower.forkserver import alive, peer_uid

KINDS = ("query", "train", "train.statistic", "train.sa_train", "evaluate")  # client.SITE_WORKER_KINDS
IDLE_S = 600.0
KEEP_S = {".lock": 86400.0, ".log": 7 * 86400.0}  # a gone worker's files are removed after this long
START_S = 120.0  # a new worker must listen within this many seconds
MAX_FRAME = 1 << 31


def socket_dir() -> Path:
    """`/tmp/dpfl-<uid>`: created 0700; refused if another user owns it or others may open it."""
    d = Path(tempfile.gettempdir()) / f"dpfl-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(f"{d} must belong to this user with mode 0700 (it holds the site workers' sockets); "
                          f"it is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}")
    return d


def socket_path(run_id: int, node_id: int) -> Path:
    key = f"{run_id}:{node_id}:{os.environ.get('FLWR_HOME', '')}"
    return socket_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.sock"


# ---------------------------------------------------------------- framing


def _send(sock: socket.socket, *parts: bytes) -> None:
    for p in parts:
        sock.sendall(struct.pack("<Q", len(p)) + p)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ProtocolError("the site worker closed the connection mid-message")
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if n > MAX_FRAME:
        raise ProtocolError(f"a site worker frame of {n} bytes exceeds {MAX_FRAME}")
    return _recv_exact(sock, n)


def _dump(r: RecordDict) -> bytes:
    return recorddict_to_proto(r).SerializeToString()


def _load(b: bytes) -> RecordDict:
    p = RecordDictProto()
    p.ParseFromString(b)
    return recorddict_from_proto(p)


def _scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in d.items()}


# ---------------------------------------------------------------- the ClientApp's side


def call(kind: str, content: RecordDict, state: RecordDict, node_config: Mapping, run_config: Mapping,
         run_id: int, node_id: int, timeout: float = 3600.0) -> RecordDict:
    """Run handler `kind` in this site's worker (starting it if needed); `state` is updated in
    place as the handler left it. A handler's error is raised here with its type and message."""
    path = socket_path(run_id, node_id)
    sock = _connect(path, timeout)
    with sock:
        head = json.dumps({"kind": kind, "node_config": _scalars(node_config), "run_config": _scalars(run_config)})
        _send(sock, head.encode(), _dump(content), _dump(state))
        status = json.loads(_recv(sock))
        if "error" in status:
            cls = getattr(errors, status["error"], None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(status["message"])
        reply, new_state = _load(_recv(sock)), _load(_recv(sock))
    for key in list(state):
        if key not in new_state:
            del state[key]
    for key, value in new_state.items():
        state[key] = value
    return reply


def _connect(path: Path, timeout: float) -> socket.socket:
    sock = _try_connect(path)
    if sock is None:
        with open(path.with_suffix(".lock"), "w") as lock:  # one starter per site
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _try_connect(path)
            if sock is None:
                _start(path)
                deadline = time.monotonic() + START_S
                while sock is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    sock = _try_connect(path)
        if sock is None:
            raise ProtocolError(f"the site worker did not listen on {path} within {START_S:.0f} s; see "
                                f"{path.with_suffix('.log')}")
    sock.settimeout(timeout)
    return sock


def _try_connect(path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        return None
    return s


def sweep(d: Path, now: float | None = None) -> int:
    """Remove the old sockets no worker answers on (one killed), then the old .lock and .log files of
    workers that are gone (no socket): one pair per (run, node), and a site serves many runs.
    Returns how many files were removed."""
    import stat

    now = time.time() if now is None else now
    removed = 0
    for f in sorted(d.iterdir(), key=lambda f: f.suffix != ".sock"):  # a dead socket first: then its files
        with contextlib.suppress(OSError):
            st = f.lstat()
            if f.suffix == ".sock":  # of a worker killed before it could remove it: nobody answers
                if stat.S_ISSOCK(st.st_mode) and now - st.st_mtime > KEEP_S[".lock"] and not _answers(f):
                    f.unlink()
                    removed += 1
                continue
            keep = KEEP_S.get(f.suffix)
            if keep is None or f.with_suffix(".sock").exists():
                continue
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > keep:
                f.unlink()
                removed += 1
    return removed


def _answers(path: Path) -> bool:
    s = _try_connect(path)
    if s is not None:
        s.close()
    return s is not None


def _start(path: Path) -> None:
    with contextlib.suppress(OSError):  # housekeeping: never in the way of a start
        sweep(path.parent)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket of a worker that is gone
    with open(path.with_suffix(".log"), "ab") as log:
        subprocess.Popen([sys.executable, "-m", "dpfl.flower.site", str(path), str(os.getppid())],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


# ---------------------------------------------------------------- the worker


def serve(path: Path, watch_pid: int, load_handlers, idle: float = IDLE_S) -> None:
    """Answer messages on `path` one at a time until `watch_pid` is gone or `idle` s pass, with the
    handlers `load_handlers()` gives (called once listening: the first caller waits for it)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o600)
    srv.listen(4)
    srv.settimeout(1.0)
    last = time.monotonic()
    handlers = load_handlers()

    try:
        while time.monotonic() - last < idle and alive(watch_pid):
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                if not _same_user(conn):
                    continue
                conn.settimeout(None)
                _answer(conn, handlers)
            last = time.monotonic()
    finally:
        srv.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _answer(conn: socket.socket, handlers: Mapping) -> None:
    try:
        head = json.loads(_recv(conn))
        kind = head["kind"]
        if kind not in KINDS:
            raise ProtocolError(f"the site worker serves {', '.join(KINDS)}, not {kind!r}")
        content, state = _load(_recv(conn)), _load(_recv(conn))
        reply = handlers[kind](content, state, head["node_config"], head["run_config"])
    except Exception as e:  # noqa: BLE001  (the caller raises it, as the handler would have in its process)
        with contextlib.suppress(OSError):
            _send(conn, json.dumps({"error": type(e).__name__, "message": str(e)}).encode())
        return
    with contextlib.suppress(OSError):
        _send(conn, b"{}", _dump(reply), _dump(state))


def _same_user(conn: socket.socket) -> bool:
    try:
        return peer_uid(conn) == os.getuid()
    except (OSError, AttributeError):
        return False
