"""The `dpfl` command.

Start-up is kept light: the sub-apps that live beside their packages (and `generate`) are listed from
`_LAZY` and imported only when one of their commands runs, and the commands here import what they need
inside their bodies. So `dpfl --help`, `dpfl schemes` and `dpfl privacy ...` never import torch
(tests/cli/test_startup.py checks it; `dpfl bench cli` times it)."""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from dpfl.errors import DpflError
from dpfl.flower.launcher import LAUNCHER_HELP, LOCAL_POLL, POLL_HELP, launcher_of, node_poll_of

if TYPE_CHECKING:
    from rich.progress import Progress

# commands living beside their packages: name -> (module, attribute, help). An attribute that is a Typer
# app becomes a command group, a function becomes one command. They are listed in this order, the
# functions before the commands defined below and the groups after them.
_LAZY = {
    "generate": ("dpfl.cli.collab", "generate_cmd", ("Private dataset generation: teachers label public data "
                                                     "by noisy max (NPZ + CSV + privacy report).")),
    "audit": ("dpfl.cli.audit", "audit_cmd", ("Privacy audit in one run: canaries, Steinke et al.'s ε lower bound "
                                              "beside the accounted ε (audit.json).")),
    "privacy": ("dpfl.cli.privacy", "app", "Privacy accounting: ε for σ, σ for ε."),
    "data": ("dpfl.cli.data", "app", "Datasets and partitions."),
    "models": ("dpfl.cli.models", "app", "Models."),
    "pate": ("dpfl.cli.pate", "app", "PATE analysis."),
    "dpsgd": ("dpfl.cli.dpsgd", "app", "Record-level DP-SGD."),
    "collab": ("dpfl.cli.collab", "app", "FedCollabNN and private dataset generation."),
    "attacks": ("dpfl.cli.attacks", "app", "Membership inference and attack tools."),
    "flower": ("dpfl.cli.flower", "app", "Deployment over Flower."),
    "accounting": ("dpfl.cli.accounting", "app", "Accounting comparison (Jayaraman & Evans)."),
    "classic": ("dpfl.cli.classic", "app", "DP classical models: functional mechanism, DP-SVM, DP random forest."),
    "stats": ("dpfl.cli.stats", "app", "DP statistics of a column: mean, count, histogram."),
}
_LAZY_COMMANDS = ("generate", "audit")  # `dpfl generate CONFIG` is the same command as `dpfl collab generate`


class _Placeholder(TyperCommand):
    """Stands for a lazy command in help listings (name and help only)."""


def _load(name: str) -> TyperCommand | TyperGroup:
    module, attr, help = _LAZY[name]
    obj = getattr(importlib.import_module(module), attr)
    holder = typer.Typer()
    if name in _LAZY_COMMANDS:
        holder.command(name, help=help)(obj)
    else:
        holder.add_typer(obj, name=name, help=help)
    return typer.main.get_group(holder).commands[name]


class _LazyGroup(TyperGroup):
    """The root group: lists the `_LAZY` commands without importing them, imports one when it is used."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        placeholder = {n: _Placeholder(n, help=h) for n, (_, _, h) in _LAZY.items()}
        self.commands = {**{n: placeholder[n] for n in _LAZY_COMMANDS}, **self.commands,
                         **{n: c for n, c in placeholder.items() if n not in _LAZY_COMMANDS}}
        self._listing = False

    # (click types left unnamed: recent typer releases ship their own copy of click)
    def format_help(self, ctx, formatter) -> None:
        self._listing = True  # the commands panel needs names and help only
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx, name: str):
        cmd = self.commands.get(name)
        if isinstance(cmd, _Placeholder) and not self._listing:
            cmd = self.commands[name] = _load(name)
        return cmd


app = typer.Typer(help="Differentially private, bandwidth-efficient federated learning.", no_args_is_help=True,
                  pretty_exceptions_enable=False, cls=_LazyGroup)
bench_app = typer.Typer(help="Benchmarks that print measured numbers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
console = Console()


def _fail(e: Exception) -> None:
    from rich.markup import escape

    from dpfl.errors import RunStopped

    if isinstance(e, RunStopped):  # asked to stop: not an error
        console.print(escape(str(e)), soft_wrap=True)
        raise typer.Exit(130)
    console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(2)


def _progress() -> Progress:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=False)


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(b) < 1000:
            return f"{b:.1f} {unit}"
        b /= 1000
    return f"{b:.1f} PB"


def execute(job, label: str) -> dict:
    """Simulate `job` (a Run) with a progress bar; returns its summary."""
    from dpfl.engine.simulator import simulate

    total = job.cfg.federation.rounds
    with _progress() as prog:
        task = prog.add_task(label, total=total, completed=job.round, info="")

        def on_round(m: dict) -> None:
            acc = m.get("accuracy")
            info = f"acc {acc:.4f}" if acc is not None else ""
            if m.get("epsilon") is not None:
                info += f"  ε {m['epsilon']:.3f}"
            if m.get("record_epsilon_max") is not None:
                info += f"  record ε max {m['record_epsilon_max']:.3f}"
            info += f"  up/client {_fmt_bytes(m['cum_up_bytes_per_client'])}"
            prog.update(task, completed=m["round"], info=info)

        return simulate(job, on_round)


@app.command()
def run(
    config: Path = typer.Argument(None, help="Run config (TOML). Omit with --resume."),
    out: Path = typer.Option(None, "--out", "-o", help="Run directory (default runs/<name>-<time>)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config key: --set federation.rounds=20 (with "
                                   "--resume: only this machine's run.threads, run.device, run.max_cohort, "
                                   "run.checkpoint_every)"),
    resume: Path = typer.Option(None, "--resume", help="Continue the run in this directory from its checkpoint."),
    rounds: int = typer.Option(None, "--rounds", help="With --resume: extend the total number of rounds."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
    allow_recalibration: bool = typer.Option(
        False, "--allow-recalibration", help="With --resume: accept a noise multiplier σ that --rounds changes."),
) -> None:
    """Run a federated experiment (or resume one)."""
    from dpfl.config import load_config
    from dpfl.errors import ConfigError
    from dpfl.run.state import Run

    try:
        if resume is not None:
            _refuse_flags("with --resume (it continues the run's own config.toml)",
                          CONFIG=config is not None, **{"--out": out is not None, "--overwrite": overwrite})
            _check_rounds(rounds)
            job = Run.resume(resume, log=console.print, rounds=rounds,
                                    allow_recalibration=allow_recalibration, resources=_resume_resources(set_))
            console.print(f"resuming {resume} at round {job.round}")
        else:
            if config is None:
                raise ConfigError("give a CONFIG file or --resume DIR")
            _refuse_flags("without --resume (for a new run use --set federation.rounds=N)",
                          **{"--rounds": rounds is not None, "--allow-recalibration": allow_recalibration})
            cfg = load_config(_resolve_config(config), set_)
            if out is None:
                out = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            job = Run(cfg, out, log=console.print, overwrite=overwrite)
        console.print(f"dataset: {job.fed.source}")
        console.print(f"scheme:  {job.scheme.describe()}  (n = {job.flat.n:,} parameters, "
                      f"{job.cfg.data.n_clients} clients, {job.cfg.cohort_size()} per round, engine "
                      f"{job.cfg.run.engine}/{job.trainer.cohort.mode})")
        if job.record_sigma is not None:
            d = job.cfg.train.dpsgd
            console.print(f"record-level DP-SGD in every client: σ = {job.record_sigma:.4g}, C = {d.clip}, "
                          f"δ = {d.delta}, Poisson batches q_k = min(1, {job.local.batch_size} / n_k), RDP per client")
        summary = execute(job, job.cfg.name)
    except DpflError as e:
        _fail(e)
    _print_summary(summary, job.out)


@app.command()
def quickstart(
    out: Path = typer.Option(Path("runs"), "--out", "-o", help="Parent directory of the two run directories."),
) -> None:
    """The one-minute tour: FL-STD, then client-level DP with secure aggregation, on the default dataset."""
    from dpfl.config import load_config
    from dpfl.experiments.report import load_run
    from dpfl.run.state import Run

    stamp = time.strftime("%Y%m%d-%H%M%S")
    done = []
    try:
        for name in ("quickstart", "quickstart-dp"):
            cfg = load_config(_resolve_config(Path(name)))
            job = Run(cfg, out / f"{name}-{stamp}", log=console.print)
            console.print(f"[bold]{name}[/bold]: {job.scheme.describe()}  ({job.flat.n:,} parameters, "
                          f"{cfg.data.n_clients} clients, {cfg.cohort_size()} a round, {cfg.federation.rounds} rounds)")
            t0 = time.perf_counter()
            summary = execute(job, name)
            done.append((name, job, summary, time.perf_counter() - t0))
    except DpflError as e:
        _fail(e)
    console.print(f"dataset: {done[0][1].fed.source}", highlight=False, soft_wrap=True)
    for name, job, summary, secs in done:
        evaluated = [m for m in load_run(job.out)[1] if m.get("accuracy") is not None]
        last = evaluated[-1] if evaluated else {}
        line = (f"{name:14s} accuracy {last.get('accuracy', float('nan')):.4f} at round {last.get('round')} "
                f"(best {summary['best']['accuracy']:.4f} at {summary['best']['round']}), "
                f"upstream/client {_fmt_bytes(last.get('cum_up_bytes_per_client', 0))}, {secs:.0f} s")
        if summary.get("epsilon_final") is not None:
            line += f", ε = {summary['epsilon_final']:.2f} at δ = {summary['delta']:g}"
            if summary.get("epsilon_note"):
                line += f" ({summary['epsilon_note']})"
        console.print(line, highlight=False, soft_wrap=True)
        console.print(f"{'':14s} run directory {job.out}", highlight=False, soft_wrap=True)
    console.print("next: `dpfl report " + " ".join(str(s.out) for _, s, _, _ in done) + "` plots both; "
                  "`dpfl reproduce list` runs the thesis tables; `dpfl schemes` lists every scheme.",
                  highlight=False, soft_wrap=True)


def _resume_resources(set_: list[str] | None) -> dict | None:
    """--set with --resume: only this machine's resources (run.threads, run.device, ...), never the experiment
    (their values are checked by `Run.resume`)."""
    from dpfl.config import RESUME_RESOURCES, apply_overrides
    from dpfl.errors import ConfigError

    if not set_:
        return None
    raw = apply_overrides({}, set_)  # checks key=value
    allowed = {f"run.{k}" for k in RESUME_RESOURCES}
    bad = sorted({item.split("=", 1)[0].strip() for item in set_} - allowed)
    if bad:
        raise ConfigError(f"with --resume, --set takes only {', '.join(f'run.{k}' for k in RESUME_RESOURCES)} "
                          f"(the run continues its own config.toml), got {', '.join(bad)}")
    return raw["run"]


def _refuse_flags(when: str, **given: bool) -> None:
    """ConfigError naming the flags given (True) that do not apply `when`."""
    from dpfl.errors import ConfigError

    bad = [name for name, on in given.items() if on]
    if bad:
        raise ConfigError(f"{', '.join(bad)} {'does' if len(bad) == 1 else 'do'} not apply {when}")


def _check_rounds(rounds: int | None) -> None:
    from dpfl.errors import ConfigError

    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {rounds}")


def _resolve_config(config: Path) -> Path:
    """A path, or the name of a built-in config (`quickstart`, `settings/setting-d-fl-std`, `table-4.4/fl-std`)."""
    if config.is_file():
        return config
    from dpfl.experiments.reproduce import configs_root

    cand = configs_root() / (str(config) if str(config).endswith(".toml") else f"{config}.toml")
    return cand if cand.is_file() else config


def _print_summary(summary: dict, out: Path | None) -> None:
    b = summary.get("best") or {}
    key = b.get("metric", "accuracy")
    if b:
        line = (f"best {key} {b.get(key, float('nan')):.4f} at round {b['round']}; "
                f"upstream/client {_fmt_bytes(b['cum_up_bytes_per_client'])} "
                f"(cost formula at the width sent {_fmt_bytes(b['formula_up_bytes_per_client'])}), "
                f"downstream/client {_fmt_bytes(b['cum_down_bytes_per_client'])}")
        if b.get("epsilon") is not None:
            line += f", ε {b['epsilon']:.3f}"
        if b.get("record_epsilon_max") is not None:
            line += f", record-level ε max {b['record_epsilon_max']:.3f}"
        console.print(line)
    if summary.get("stopped"):
        console.print(f"stopped early: {summary['stopped']}")
    if out:
        console.print(f"run directory: {out}")


@app.command()
def report(
    run_dirs: list[Path] = typer.Argument(..., help="One or more run directories."),
    out: Path = typer.Option(None, "--out", "-o", help="Where to write the PNG plots (default: first run dir)."),
    wide: bool = typer.Option(False, "--wide", help="Every column, however wide the terminal."),
) -> None:
    """Best-round table of runs, and plots (accuracy vs round, vs cumulative upstream bytes, vs ε)."""
    from dpfl.experiments.report import report_runs

    try:
        report_runs(run_dirs, out or run_dirs[0], console, wide=wide)
    except DpflError as e:
        _fail(e)


@app.command()
def reproduce(
    table: str = typer.Argument(..., help="Table id (e.g. table-4.4); `dpfl reproduce list` lists them."),
    rows: list[str] = typer.Option([], "--row", help="Run only these rows (repeatable)."),
    rounds: int = typer.Option(None, "--rounds", help="Override the number of rounds (shorter smoke runs)."),
    out: Path = typer.Option(Path("runs/reproduce"), "--out", "-o", help="Parent directory of the row runs."),
    set_: list[str] = typer.Option([], "--set", help="Config override applied to every row."),
    accountant: str = typer.Option(None, "--accountant", help="Re-calibrate DP rows' σ under this accountant."),
    report_only: bool = typer.Option(False, "--report-only",
                                     help="Run nothing: compare the runs already under --out (e.g. records)."),
    wide: bool = typer.Option(False, "--wide", help="Every column, however wide the terminal."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start the chosen rows afresh, replacing their runs."),
    allow_recalibration: bool = typer.Option(
        False, "--allow-recalibration", help="Resume rows whose noise multiplier σ --rounds changes."),
    replay: int = typer.Option(
        None, "--replay", help="Run the first N rounds of every row recorded under --out again and compare "
                               "the metrics with the records (TABLE may be `all`); writes nothing."),
) -> None:
    """Run a thesis table's rows (resuming finished/partial rows) and print measured vs thesis."""
    from dpfl.experiments.reproduce import list_tables, reproduce_table

    try:
        if replay is not None:
            from dpfl.experiments.replay import replay as replay_rows

            _refuse_flags("with --replay (it reruns recorded rows as recorded)", **{
                "--row": bool(rows), "--rounds": rounds is not None, "--set": bool(set_),
                "--accountant": accountant is not None, "--report-only": report_only, "--overwrite": overwrite,
                "--allow-recalibration": allow_recalibration})
            results = replay_rows(out, table, replay, console)
            if any(r["diffs"] for r in results):
                raise typer.Exit(1)
            return
        if table == "list":
            _refuse_flags("to `dpfl reproduce list`", **{
                "--row": bool(rows), "--rounds": rounds is not None, "--set": bool(set_),
                "--accountant": accountant is not None, "--report-only": report_only, "--overwrite": overwrite,
                "--allow-recalibration": allow_recalibration})
            for name, desc in list_tables().items():
                console.print(f"{name:14s} {desc}")
            return
        if report_only:
            _refuse_flags("with --report-only (it runs nothing)", **{
                "--rounds": rounds is not None, "--set": bool(set_), "--overwrite": overwrite,
                "--allow-recalibration": allow_recalibration})
        _check_rounds(rounds)
        reproduce_table(table, rows=rows, rounds=rounds, out=out, overrides=set_, accountant=accountant,
                        console=console, execute=execute, report_only=report_only, wide=wide,
                        overwrite=overwrite, allow_recalibration=allow_recalibration)
    except DpflError as e:
        _fail(e)


@app.command()
def publish(
    root: Path = typer.Option(Path("."), "--root", help="Repository root holding records/, README.md, docs/."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 where a block differs from records/."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Also write docs/figures/TABLE.png."),
) -> None:
    """README headline table, docs/RESULTS.md tables and figures, generated from records/ only."""
    from dpfl.experiments.publish import publish as publish_docs

    try:
        stale = publish_docs(root, console, check=check, figures=figures)
    except DpflError as e:
        _fail(e)
    if check and stale:
        raise typer.Exit(1)


@app.command()
def schemes() -> None:
    """List the schemes."""
    from dpfl.schemes.index import list_schemes

    for name, desc in list_schemes().items():
        console.print(f"[bold]{name:14s}[/bold] {desc}")


@bench_app.command("engine")
def bench_engine(
    rounds: int = typer.Option(2, help="Timed rounds per path."),
    clients: int = typer.Option(100, help="Clients per round."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON line with the numbers last."),
) -> None:
    """Setting D round: vectorized engine vs a plain per-client PyTorch loop vs the FLOP bound."""
    from dpfl.bench.engine import run_bench

    res = run_bench(rounds=rounds, clients=clients, device=device, console=console)
    if json_out:
        console.print_json(json.dumps(res))


@bench_app.command("record-fl")
def bench_record_fl(
    rounds: int = typer.Option(2, min=1, help="Rounds on each side (accuracy and ε after them)."),
    clients: int = typer.Option(100, min=1, help="Clients per round (setting D: 100)."),
    clip: float = typer.Option(1.0, help="Per-example clipping norm C."),
    noise_multiplier: float = typer.Option(1.1, help="Noise multiplier σ."),
    opacus_mode: str = typer.Option("hooks", help="Opacus grad_sample_mode: hooks (Flower's example), functorch, ghost."),
    threads: int = typer.Option(1, min=1, help="torch threads."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON line with the numbers last."),
) -> None:
    """Record-level DP-SGD in setting D's clients: dpfl's cohort engine vs a per-client Opacus loop."""
    from dpfl.bench.record_fl import run_bench

    res = run_bench(rounds=rounds, clients=clients, clip=clip, noise_multiplier=noise_multiplier,
                    mode=opacus_mode, threads=threads, console=console)
    if json_out:
        console.print_json(json.dumps(res))


@bench_app.command("flower")
def bench_flower(
    config: str = typer.Option("deploy-demo", help="run config: a TOML file or a built-in name (deploy-demo: the "
                                                   "cross-silo recipe; deploy-mechanics: FL-SIGN-DP)"),
    evaluation: str = typer.Option("both", help="server | federated | both"),
    launcher: str | None = typer.Option(None, help=LAUNCHER_HELP),
    node_poll: float = typer.Option(LOCAL_POLL, help=POLL_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON line with the numbers last."),
) -> None:
    """A run over a local Flower federation (3 sites) vs the simulator: time per phase, bytes, ε."""
    from dpfl.bench.flower import run_bench
    from dpfl.config import dump_config, load_config

    try:
        poll = node_poll_of(node_poll)
        launcher = launcher_of(launcher, poll)
        cfg = load_config(_resolve_config(Path(config)))
    except DpflError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    res = run_bench(dump_config(cfg), evaluation=evaluation, launcher=launcher, node_poll=poll,
                    console=console)
    if json_out:
        console.print_json(json.dumps({k: v for k, v in res.items() if k not in ("metrics", "simulator", "commands")}))


@bench_app.command("flower-idle")
def bench_flower_idle(
    node_poll: Annotated[list[float] | None, typer.Option(help="SuperNode polls to measure, in s (3: Flower's own "
                                                                "flower-supernode); default 0.2, 0.5 and 3")] = None,
    seconds: float = typer.Option(20.0, min=1.0, help="seconds measured, after 10 s to settle"),
) -> None:
    """CPU an idle local Flower federation (3 sites, TLS) uses, per SuperNode poll."""
    from dpfl.bench.flower import idle_cpu

    try:
        polls = [node_poll_of(p) for p in (node_poll or [0.2, 0.5, 3.0])]
    except DpflError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    idle_cpu(polls, seconds=seconds, log=console.print)


@bench_app.command("noise")
def bench_noise(
    values: int = typer.Option(1 << 22, min=1 << 12, help="Values per timed draw on the CPU."),
    device: str = typer.Option(None, help="Also draw on this device (e.g. cuda), and run the rounds there."),
    rounds: int = typer.Option(3, min=2, help="Rounds per scheme for the round table (the first is warm-up)."),
    skip_rounds: bool = typer.Option(False, "--no-rounds", help="Only the sampler rates."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON line with the numbers last."),
) -> None:
    """DP noise: Gaussians per second (one core, all cores, a device) beside the keystream, torch.randn,
    NumPy and the sampler before; and the noise share of setting-D DP rounds."""
    from dpfl.bench.noise import run_bench
    from dpfl.errors import ConfigError

    if device is not None:
        import torch

        if device != "cuda" and not device.startswith("cuda:"):
            _fail(ConfigError(f"--device must be 'cuda' or 'cuda:N' (the CPU is always measured), got {device!r}"))
        if not torch.cuda.is_available():
            _fail(ConfigError(f"--device {device}: torch sees no CUDA device here"))
    res = run_bench(n=values, device=device, rounds=rounds, with_rounds=not skip_rounds, console=console)
    if json_out:
        console.print_json(json.dumps(res))


@bench_app.command("cli")
def bench_cli(
    reps: int = typer.Option(5, min=1, help="Timed runs per command (median, min, max)."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON line with the numbers last."),
) -> None:
    """Start-up: `dpfl --help`, `dpfl schemes`, `dpfl privacy epsilon` as fresh processes vs `python -c pass`."""
    from dpfl.bench.cli import run_bench

    res = run_bench(reps=reps, console=console)
    if json_out:
        console.print_json(json.dumps(res))


def _mount_bench(name: str, module: str, help: str) -> None:
    @bench_app.command(name, help=help)
    def _cmd() -> None:
        try:
            mod = importlib.import_module(module)
            mod.run_bench()
        except DpflError as e:  # e.g. a setting in the environment that does not apply
            from rich.markup import escape

            console.print(f"[red]error:[/red] {escape(str(e))}")
            raise typer.Exit(2) from None


for _n, _m, _h in [("privacy", "dpfl.bench.privacy", "Time to account 10,000 rounds under each backend."),
                   ("sign", "dpfl.bench.sign", "FL-SIGN/signSGD sign, encode, decode and sum: 1 thread vs all cores."),
                   ("secagg", "dpfl.bench.secagg", "Secure aggregation vs plain summation, 100 × 1.66 M."),
                   ("cs", "dpfl.bench.cs", "CS reconstruction solver vs OWL-QN (pylbfgs)."),
                   ("dpsgd", "dpfl.bench.dpsgd", "Per-example-gradient throughput vs Opacus."),
                   ("attacks", "dpfl.bench.attacks", "Membership-inference advantage of FL-STD, FL-SIGN and their DP versions."),
                   ("classic", "dpfl.bench.classic", "DP classical models: utility vs ε beside scikit-learn."),
                   ("stats", "dpfl.bench.stats", "DP histograms: measured error vs the closed forms, keys released.")]:
    _mount_bench(_n, _m, _h)


if __name__ == "__main__":
    app()
