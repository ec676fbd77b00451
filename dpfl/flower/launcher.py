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
fine for a few sites, not for thousands.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from dpfl.errors import ConfigError

NAME = "flwr-clientapp"
MARK = "# written by dpfl.flower.launcher"

SCRIPT = '''#!{python}
{mark}: Flower's own `flwr-clientapp`, loaded from its file without the package
# flwr.supernode.cli, whose __init__ imports the SuperNode's command (unused by a ClientApp)
import importlib.util
import os
import sys

import flwr.supernode

path = os.path.join(flwr.supernode.__path__[0], "cli", "flwr_clientapp.py")
if os.path.isfile(path):
    spec = importlib.util.spec_from_file_location("_flwr_clientapp", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    main = module.flwr_clientapp
else:
    from flwr.supernode.cli import flwr_clientapp as main
sys.exit(main())
'''


SUPERNODE = "dpfl-supernode"
FLOWER_POLL = 3.0  # Flower's SuperNode: idle seconds between pulls (start_client_internal.py)
POLL_RANGE = (0.05, 3.0)
LOCAL_POLL = 0.5  # a local federation's SuperNodes (loopback, a few sites): `dpfl flower local`, `dpfl bench flower`

SUPERNODE_SCRIPT = '''#!{python}
{mark}: Flower's own `flower-supernode`, idle {poll} s between its pulls from
# the SuperLink (Flower: 3 s) and checking for a ClientApp's reply every 0.05 s (Flower: 0.5 s)
import sys
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
from flwr.supernode.cli import flower_supernode  # noqa: E402

sys.exit(flower_supernode())
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
    return _put(_own_dir(directory), NAME, SCRIPT.format(python=sys.executable, mark=MARK))


def check_poll(poll: float) -> float:
    lo, hi = POLL_RANGE
    if not (lo <= poll < hi):  # also refuses NaN
        raise ConfigError(f"the SuperNode poll must be at least {lo} s and under Flower's own {hi:g} s, got {poll}")
    return float(poll)


POLL_HELP = ("the SuperNodes' idle seconds between pulls from the SuperLink: under 3, they run as dpfl-supernode "
             "(Flower's SuperNode with that poll, `dpfl flower launcher --node-poll`); 3: Flower's own flower-supernode")


def node_poll_of(seconds: float) -> float | None:
    """A --node-poll value: None for Flower's own 3 s, else the checked poll."""
    return None if seconds == FLOWER_POLL else check_poll(seconds)


def write_both(directory: str | Path, poll: float) -> tuple[Path, Path]:
    """`write` and `write_supernode`, each file checked before either is written."""
    poll = check_poll(poll)
    d = _own_dir(directory)
    for name in (NAME, SUPERNODE):
        _refuse_foreign(d / name)
    return write(d), write_supernode(d, poll)


def write_supernode(directory: str | Path, poll: float) -> Path:
    """Write `directory/dpfl-supernode`: `flower-supernode` idle `poll` s between pulls (same
    directory rules as `write`). Returns the file."""
    poll = check_poll(poll)
    return _put(_own_dir(directory), SUPERNODE, SUPERNODE_SCRIPT.format(python=sys.executable, mark=MARK, poll=poll))


def path_with(directory: str | Path, path: str | None) -> str:
    """PATH with `directory` first (an unset PATH: the system's default after it)."""
    return os.pathsep.join([str(Path(directory).resolve()), path or os.defpath])
