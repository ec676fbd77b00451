"""A quicker start for the ClientApp processes Flower launches, one per message.

Flower's SuperExec starts each ClientApp as the command `flwr-clientapp`, found on its PATH.
Flower's own script for it imports the package `flwr.supernode.cli`, whose `__init__` also imports
the SuperNode's command (its SQL state, FastAPI, ...), none of which a ClientApp uses: 2.0 s of
imports on a 2-core Xeon, for every message. `write(directory)` writes a `flwr-clientapp` there
that runs the same function, `flwr_clientapp()` from Flower's file `supernode/cli/flwr_clientapp.py`,
loaded without that package's `__init__` (0.7 s), under this Python (no version-manager shim).
Put the directory first on the SuperNode's PATH: `dpfl flower local` does, a site started by hand
may (docs/deployment.md). Where Flower has no such file, the script imports it the usual way.
"""

from __future__ import annotations

import os
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
    spec.loader.exec_module(module)
    main = module.flwr_clientapp
else:
    from flwr.supernode.cli import flwr_clientapp as main
sys.exit(main())
'''


def write(directory: str | Path) -> Path:
    """Write `directory/flwr-clientapp` (mode 0700; the directory is created 0700 and must belong
    to this user and be closed to others: Flower executes what it finds there). Returns the file."""
    if any(c.isspace() for c in sys.executable):
        raise ConfigError(f"this Python's path ({sys.executable}) holds a space, which a #! line cannot: "
                          "start ClientApps with Flower's own flwr-clientapp (--launcher flower)")
    d = Path(directory).absolute()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ConfigError(f"{d} must belong to this user and be writable by no one else (Flower runs the "
                          f"{NAME} it holds); it is owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}")
    path = d / NAME
    tmp = d / f".{NAME}.{os.getpid()}.tmp"
    tmp.write_text(SCRIPT.format(python=sys.executable, mark=MARK))
    tmp.chmod(0o700)
    os.replace(tmp, path)
    return path


def path_with(directory: str | Path, path: str | None) -> str:
    """PATH with `directory` first."""
    return os.pathsep.join([str(Path(directory).absolute()), *([path] if path else [])])
