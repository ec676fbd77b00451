"""`dpfl dpsgd ...`: central DP-SGD training."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import ConfigError, DpflError

app = typer.Typer(
    help="Record-level DP-SGD (per-example clipping, Gaussian noise, Poisson sampling).", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Record-level DP-SGD."""


@app.command("train")
def train_cmd(
    dataset: str = typer.Option("fashion-mnist", help="dataset name (dpfl.data)"),
    model: str = typer.Option("cnn", help="model name (dpfl.models)"),
    model_options: str = typer.Option("{}", help="model options as JSON, e.g. '{\"in_features\": 784}'"),
    n_train: int = typer.Option(None, help="use this many training examples (default all)"),
    n_test: int = typer.Option(None, help="use this many test examples (default all)"),
    epochs: float = typer.Option(1.0, help="epochs; steps T = epochs / q"),
    lot_size: int = typer.Option(256, help="expected lot size L; Poisson rate q = L / N"),
    clip: float = typer.Option(1.0, help="per-example clipping bound C"),
    noise_multiplier: float = typer.Option(None, help="σ (noise std σC); or give --target-epsilon"),
    target_epsilon: float = typer.Option(None, help="calibrate σ to reach this ε after the planned steps"),
    delta: float = typer.Option(1e-5, help="δ"),
    lr: float = typer.Option(0.5, help="learning rate"),
    momentum: float = typer.Option(0.0, help="heavy-ball momentum (post-processing)"),
    accountant: str = typer.Option("rdp", help="rdp, pld or moments"),
    seed: int = typer.Option(0, help="seed (data split, init, sampling and noise streams)"),
    device: str = typer.Option("cpu", help="torch device for the gradients (cpu, cuda, ...)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Train a model with DP-SGD and report test accuracy and (ε, δ)."""
    from dpfl.dpsgd.central import config_from, run_central

    try:
        try:
            opts = json.loads(model_options)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--model-options must be a JSON object: {e}") from None
        cfg = config_from(
            dataset=dataset,
            model=model,
            model_options=opts,
            n_train=n_train,
            n_test=n_test,
            epochs=epochs,
            lot_size=lot_size,
            clip=clip,
            noise_multiplier=noise_multiplier,
            target_epsilon=target_epsilon,
            delta=delta,
            lr=lr,
            momentum=momentum,
            accountant=accountant,
            seed=seed,
            device=device,
        )
        res = run_central(cfg)
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    t = Table(
        title=f"DP-SGD {res['model']} on {res['dataset']} ({res['n_train']} train / {res['n_test']} test)"
    )
    for col in ("epoch", "ε", "test accuracy"):
        t.add_column(col, justify="right")
    for h in res["history"]:
        t.add_row(f"{h['epoch']:.2f}", f"{h['epsilon']:.3f}", f"{h.get('test_accuracy', float('nan')):.4f}")
    Console().print(t)
    typer.echo(
        f"σ = {res['noise_multiplier']:.4f}, q = {res['sample_rate']:.5f}, T = {res['steps']}, "
        f"C = {res['clip']}, (ε, δ) = ({res['epsilon']:.4f}, {res['delta']:g}) [{res['accountant']}], "
        f"{res['seconds']:.1f} s"
    )
