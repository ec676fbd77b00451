"""`dpfl flower ...`: credentials, the Flower App for a config, and a local federation."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from dpfl.errors import ConfigError, DpflError
from dpfl.flower.launcher import LAUNCHER_HELP, LOCAL_POLL, POLL_HELP, launcher_of, node_poll_of

app = typer.Typer(help="Run dpfl configs on Flower's deployment runtime (SuperLink, SuperNodes, flwr run).",
                  no_args_is_help=True)
console = Console(width=140)


@app.callback()
def _group() -> None:
    """Deployment over Flower."""


def _fail(e: Exception) -> None:
    from rich.markup import escape

    console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(2)


def _say(text: str) -> None:
    """A line as it is: sites' errors and log lines may hold [brackets], which are not markup."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _config_text(config: Path, overrides: list[str]) -> str:
    """The config as TOML text, validated, with --set overrides applied."""
    from dpfl.cli.main import _resolve_config
    from dpfl.config import dump_config, load_config

    config = _resolve_config(config)  # a path, or the name of a built-in config
    cfg = load_config(config, overrides)
    return dump_config(cfg) if overrides else config.read_text()


SITE_KEYS = ("data-path", "test-path", "label-column", "data-shape", "data-scale", "site-key")
SITE_PATHS = ("data-path", "test-path", "site-key")


def site_options(items: list[str]) -> dict[int, dict[str, object]]:
    """--site I:key=value options → client id → its node config keys (paths made absolute: the
    SuperNodes run in the federation's directory)."""
    out: dict[int, dict[str, object]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        cid, colon, key = head.partition(":")
        if not (sep and colon and cid.isdigit() and value):
            raise ConfigError(f"--site takes I:key=value (e.g. 0:data-path=sites/client-0.npz), got {item!r}")
        if key not in SITE_KEYS:
            raise ConfigError(f"--site key must be one of {', '.join(SITE_KEYS)}, got {key!r}")
        v: object = str(Path(value).absolute()) if key in SITE_PATHS else value
        if key == "data-scale":
            try:
                v = float(value)
            except ValueError:
                raise ConfigError(f"--site {cid}:data-scale must be a number, got {value!r}") from None
        if key in out.get(int(cid), {}):
            raise ConfigError(f"--site {cid}:{key} is given twice")
        out.setdefault(int(cid), {})[key] = v
    return out


@app.command("certs")
def certs_cmd(
    out_dir: Annotated[Path, typer.Argument(help="directory for ca.crt, server.pem, server.key (and node keys)")],
    host: Annotated[list[str] | None, typer.Option(help="SuperLink host name or IP in the certificate "
                                                         "(repeat; default 127.0.0.1 and localhost)")] = None,
    nodes: int = typer.Option(0, help="also write SuperNode authentication keys node-0 .. node-(N-1)"),
    days: int = typer.Option(365, help="certificate lifetime in days"),
) -> None:
    """Self-signed CA and SuperLink TLS certificate (and SuperNode keys) for local use."""
    from dpfl.flower import certs

    try:
        d = certs.make_tls(out_dir, tuple(host or ("127.0.0.1", "localhost")), days)
        if nodes:
            certs.make_node_keys(out_dir, nodes)
    except DpflError as e:
        _fail(e)
    console.print(f"wrote {d / certs.CA_CERT}, {d / certs.SERVER_CERT}, {d / certs.SERVER_KEY}"
                  + (f", node-0 .. node-{nodes - 1} (+ .pub) and {certs.PEERS} (the approved keys, for every site)"
                     if nodes else ""))


@app.command("app")
def app_cmd(
    out_dir: Annotated[Path, typer.Argument(help="the Flower App directory to write (then: flwr run DIR CONNECTION)")],
    config: Annotated[Path, typer.Option("--config", "-c", help="dpfl run config (TOML)")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a config key, e.g. "
                                                                 "--set federation.rounds=5")] = None,
    results: str = typer.Option("", help="directory where the ServerApp writes metrics, model and summary"),
    reproducible: bool = typer.Option(False, help="server randomness from the config seed (tests; not private)"),
    timeout: float = typer.Option(300.0, help="seconds to wait for each phase's replies"),
    evaluation: str = typer.Option("both", help="server | federated | both: the global model on the server's "
                                                "test data, on every site's held-out data added up, or both"),
    resume: bool = typer.Option(False, help="continue the run in --results from its checkpoint (its ledger: "
                                            "the ε spent is kept)"),
    peers: str = typer.Option("", help="the operator-approved site keys (peers.toml) on the SuperLink machine: "
                                       "a site that cannot prove its listed key is refused"),
) -> None:
    """Write the Flower App (a pyproject.toml) that runs a dpfl config."""
    from dpfl.flower.appdir import write_app

    try:
        d = write_app(out_dir, _config_text(config, set_ or []), out_dir=results, reproducible=reproducible,
                      timeout=timeout, evaluation=evaluation, resume=resume, peers=peers)
    except (DpflError, OSError) as e:
        _fail(e)
    console.print(f"wrote {d / 'pyproject.toml'}; run it with: flwr run {d} <connection> --stream")


@app.command("launcher")
def launcher_cmd(
    out_dir: Annotated[Path, typer.Argument(help="directory for flwr-clientapp (created 0700)")],
    node_poll: Annotated[float | None, typer.Option(help="also write dpfl-supernode: Flower's flower-supernode, "
                                                         "idle this many s between pulls from the SuperLink "
                                                         "(Flower: 3 s; at least 0.05)")] = None,
    fork: Annotated[bool | None, typer.Option(help="with --node-poll: dpfl-supernode starts dpfl's fork server, "
                                                   "whose forks run the SuperNode's ClientApps (default: on)")] = None,
    node_heartbeat: Annotated[float | None, typer.Option(help="with --node-poll: the heartbeat interval "
                                                             "dpfl-supernode declares, 10 to 1800 s (Flower: 30); "
                                                             "the SuperLink counts a silent site offline after "
                                                             "2 intervals")] = None,
) -> None:
    """A quicker flwr-clientapp for a site's SuperNode: start it with this directory first on PATH."""
    from dpfl.flower import launcher

    try:
        if (fork is not None or node_heartbeat is not None) and node_poll is None:
            raise ConfigError("--fork/--no-fork and --node-heartbeat apply to dpfl-supernode: give --node-poll too")
        f, node = ((launcher.write(out_dir), None) if node_poll is None
                   else launcher.write_both(out_dir, node_poll, fork=fork is not False,
                                            heartbeat=launcher.FLOWER_HEARTBEAT if node_heartbeat is None
                                            else node_heartbeat))
    except (DpflError, OSError) as e:
        _fail(e)
    start = "flower-supernode" if node is None else str(node)
    console.print(f"wrote {f}" + ("" if node is None else f" and {node}")
                  + f"; start the SuperNode with PATH=\"{f.parent}:$PATH\" {start} ...")


@app.command("local")
def local_cmd(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="dpfl run config (TOML file or built-in "
                                                "name; default deploy-demo: the cross-silo recipe, record-level "
                                                "DP-SGD in 3 sites and a secure sum; deploy-mechanics: FL-SIGN-DP); "
                                                "one SuperNode per client")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a config key, e.g. "
                                                                 "--set federation.rounds=5")] = None,
    workdir: Annotated[Path | None, typer.Option(help="where the app, certificates, logs and results go "
                                                      "(default: a new temporary directory)")] = None,
    tls: bool = typer.Option(True, help="TLS between SuperNodes and the SuperLink (self-signed CA)"),
    auth: bool = typer.Option(False, help="SuperNode authentication (registered EC P-384 keys; needs TLS)"),
    reproducible: bool = typer.Option(False, help="seed all randomness from the config (NOT private): the "
                                                  "result then equals `dpfl run` and is compared with it"),
    timeout: float = typer.Option(1800.0, help="seconds the whole run may take"),
    evaluation: str = typer.Option("both", help="server | federated | both (see `dpfl flower app`)"),
    resume: Annotated[Path | None, typer.Option(help="continue the run in this workdir from its checkpoint "
                                                     "(a new federation; the config and ledger are the run's)")] = None,
    launcher: str | None = typer.Option(None, help=LAUNCHER_HELP),
    node_poll: float = typer.Option(LOCAL_POLL, help=POLL_HELP),
    site: Annotated[list[str] | None, typer.Option(help="a site's own data, I:key=value (repeat): client I's "
                                                   f"{', '.join(SITE_KEYS)} (docs/site-data.md), e.g. "
                                                   "--site 0:data-path=sites/client-0.npz")] = None,
) -> None:
    """Start a SuperLink and N SuperNodes on 127.0.0.1, run the config with `flwr run`, tear down."""
    from dpfl.bench.flower import compare, table
    from dpfl.flower.local import run_local

    try:
        poll = node_poll_of(node_poll)
        mode = launcher_of(launcher, poll)
        sites = site_options(site or [])
        if resume is None and config is None:
            config = Path("deploy-demo")  # the cross-silo recipe: record-level DP-SGD in 3 sites, secure sum
        if resume is not None:
            if config is not None or set_ or workdir is not None or reproducible:
                raise ConfigError("--resume continues a run with its own config and workdir: leave out --config, "
                                  "--set, --workdir and --reproducible")
            res = run_local(None, resume, tls=tls, auth=auth, timeout=timeout, resume=True, evaluation=evaluation,
                            node_config=sites, launcher=mode, node_poll=poll, log=_say)
            work = resume
        elif reproducible:
            text, work = _config_text(config, set_ or []), workdir or Path(tempfile.mkdtemp(prefix="dpfl-flower-"))
            if sites:
                raise ConfigError("--reproducible compares with the simulator on the built-in dataset: leave out --site")
            res = compare(text, str(work), tls=tls, auth=auth, timeout=timeout, launcher=mode, node_poll=poll,
                          log=_say)
            table(res, console)
            console.print(f"final model equals the simulator's: {res['equal']} (max |Δw| = {res['max_abs_diff']:.3g})")
        else:
            text, work = _config_text(config, set_ or []), workdir or Path(tempfile.mkdtemp(prefix="dpfl-flower-"))
            res = run_local(text, work, tls=tls, auth=auth, timeout=timeout, evaluation=evaluation, launcher=mode,
                            node_config=sites, node_poll=poll, log=_say)
    except DpflError as e:
        _fail(e)
    console.print(f"run {res['run_seconds']:.1f} s (startup {res['startup_seconds']:.1f} s); results in "
                  f"{Path(work) / 'out'}; logs in {res['logs']}")
