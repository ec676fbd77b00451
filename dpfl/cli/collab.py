"""`dpfl collab run CONFIG` and `dpfl generate CONFIG` (FedCollabNN and private dataset generation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import DpflError

app = typer.Typer(
    help="FedCollabNN: loss-aggregating collaborative learning and private dataset generation.",
    no_args_is_help=True,
)


@app.callback()
def _group() -> None:
    """FedCollabNN experiments and private dataset generation."""


def _fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2) from None


def _last(run: dict, alg: str, key: str):
    return run[alg]["history"][-1][key] if alg in run and run[alg]["history"] else None


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Argument(help="TOML experiment config (see dpfl/collab/configs/)")],
    out: Annotated[Path | None, typer.Option(help="results JSON (default: the config's `out`)")] = None,
) -> None:
    """Alg. 2 vs traditional FL (Alg. 1) vs independent training, for each worker count."""
    from dpfl.collab.config import load_config
    from dpfl.collab.experiment import run_experiment

    try:
        cfg = load_config(config)
        console = Console()
        res = run_experiment(cfg, log=console.print)
    except DpflError as e:
        _fail(e)
    path = out or Path(cfg.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    t = Table(
        title=f"FedCollabNN on {res['dataset']} ({res['n_train']} train / {res['n_test']} test), "
        f"final epoch test accuracy"
    )
    for col in (
        "K",
        "Alg.2 mean worker",
        "Alg.2 vote",
        "Alg.2 noisy vote",
        "Alg.2 softmax",
        "indep. mean worker",
        "indep. vote",
        "FedAvg",
        "max |θ_Alg2 − θ_indep|",
    ):
        t.add_column(col, justify="right")
    for r in res["runs"]:
        w = _last(r, "fedcollab", "worker_accuracy")
        wi = _last(r, "independent", "worker_accuracy")
        fa = _last(r, "fedavg", "worker_accuracy")
        diff = r.get("max_param_diff_fedcollab_vs_independent")
        t.add_row(
            str(r["workers"]),
            _fmt(sum(w) / len(w) if w else None),
            _fmt(_last(r, "fedcollab", "vote_accuracy")),
            _fmt(_last(r, "fedcollab", "noisy_vote_accuracy")),
            _fmt(_last(r, "fedcollab", "softmax_accuracy")),
            _fmt(sum(wi) / len(wi) if wi else None),
            _fmt(_last(r, "independent", "vote_accuracy")),
            _fmt(fa[0] if fa else None),
            "-" if diff is None else f"{diff:.2e}",
        )
    Console().print(t)
    typer.echo(f"results: {path}")


@app.command("generate")
def generate_cmd(
    config: Annotated[Path, typer.Argument(help="TOML config with a \\[generate] section (e.g. dpfl/collab/configs/generate-fmnist.toml)")],
    out_dir: Annotated[Path | None, typer.Option(help="output folder (default: generate.out_dir)")] = None,
) -> None:
    """Train worker teachers, label public data by noisy max, write NPZ + CSV + privacy report."""
    from dpfl.collab.config import load_config
    from dpfl.collab.generate import generate_dataset

    try:
        rep = generate_dataset(load_config(config), out_dir)
    except DpflError as e:
        _fail(e)
    p = rep["privacy"]
    t = Table(title=f"Generated {rep['queries']} labels from {rep['teachers']} teachers ({p['mechanism']})")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("ε data-independent", f"{p['eps_data_independent']:.4f} at δ = {p['delta']:g}")
    t.add_row("ε data-dependent (raw, not private)", f"{p['eps_data_dependent']:.4f}")
    if p["answered"] is not None:
        t.add_row("queries answered", f"{p['answered']} of {rep['queries']}")
    if p["eps_data_dependent_released"] is not None and p["release_order"] is not None:
        t.add_row(
            "ε data-dependent, smooth-sensitivity release",
            f"{p['eps_data_dependent_released']:.4f} (order {p['release_order']:g}, includes its own RDP)",
        )
    elif p["eps_data_dependent_released"] is not None:
        t.add_row(
            "ε data-dependent, smooth-sensitivity release",
            f"{p['eps_data_dependent_released']:.4f} (release costs ({p['release_epsilon']:.3f}, δ))",
        )
    t.add_row("label accuracy (evaluation)", f"{rep['label_accuracy']:.4f}")
    if "student_test_accuracy" in rep:
        t.add_row(f"student ({rep['student_model']}) test accuracy", f"{rep['student_test_accuracy']:.4f}")
    Console().print(t)
    for f in rep["files"]:
        typer.echo(f"wrote {f}")
