"""`dpfl data list|show|partition`: what datasets exist, what a load gives, how a split looks."""

from __future__ import annotations

import json

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from dpfl.data import dataset_options, list_datasets, load_dataset, partition
from dpfl.errors import ConfigError, DpflError

app = typer.Typer(help="Datasets (local files or synthetic) and client partitions.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Datasets and partitions."""


def _options(text: str) -> dict:
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"options must be a JSON object, e.g. '{{\"scale\": 0.01}}': {e}") from None
    if not isinstance(opts, dict):
        raise ConfigError(f"options must be a JSON object, got {text!r}")
    return opts


@app.command("list")
def list_cmd() -> None:
    """Dataset names, options and descriptions."""
    t = Table("dataset", "description", "options (defaults)")
    for name, desc in list_datasets().items():
        t.add_row(name, desc, ", ".join(f"{k}={v}" for k, v in dataset_options(name).items()))
    Console().print(t)


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="dataset name (see `dpfl data list`)"),
    root: str = typer.Option(
        None, help="directory (or file) holding the data; default: search the usual places"
    ),
    seed: int = typer.Option(0, help="seed for subsets and synthetic data"),
    options: str = typer.Option("{}", help="loader options as JSON, e.g. '{\"scale\": 0.01}'"),
) -> None:
    """Load a dataset and print its shapes, class counts and source."""
    try:
        ds = load_dataset(name, root=root, seed=seed, **_options(options))
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    t = Table("field", "value", title=name)
    for k, v in ds.summary().items():
        t.add_row(k, str(v))
    Console().print(t)


@app.command("partition")
def partition_cmd(
    name: str = typer.Argument(..., help="dataset name"),
    clients: int = typer.Option(..., help="number of clients"),
    method: str = typer.Option("shards", help="shards | dirichlet | classes | quantity"),
    root: str = typer.Option(None, help="data directory or file"),
    seed: int = typer.Option(0, help="seed for the data and the split"),
    options: str = typer.Option("{}", help="loader options as JSON"),
    split_options: str = typer.Option("{}", help="partitioner options as JSON, e.g. '{\"alpha\": 0.1}'"),
) -> None:
    """Split a dataset's training set and print client sizes and label skew."""
    try:
        ds = load_dataset(name, root=root, seed=seed, **_options(options))
        y = ds.y_train.numpy()
        parts = partition(y, clients, method, seed=seed, **_options(split_options))
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    sizes = np.array([len(p) for p in parts])
    global_p = np.bincount(y, minlength=ds.num_classes) / len(y)
    tv = [
        0.5 * np.abs(np.bincount(y[p], minlength=ds.num_classes) / max(len(p), 1) - global_p).sum()
        for p in parts
    ]
    ncls = [len(np.unique(y[p])) for p in parts]
    t = Table("measure", "value", title=f"{name}: {method} over {clients} clients")
    t.add_row("samples used", f"{sizes.sum()} of {len(y)}")
    t.add_row("client size min / mean / max", f"{sizes.min()} / {sizes.mean():.1f} / {sizes.max()}")
    t.add_row("classes per client min / max", f"{min(ncls)} / {max(ncls)}")
    t.add_row("label skew (mean total variation to global)", f"{np.mean(tv):.3f}")
    Console().print(t)
