"""`dpfl data list|show|partition|export`: what datasets exist, what a load gives, how a split looks, and a
client's partition written as site data files (docs/site-data.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import typer
from rich.console import Console
from rich.table import Table

from dpfl.data import (
    SITE_FORMATS,
    dataset_options,
    is_8bit,
    list_datasets,
    load_dataset,
    partition,
    site_test_split,
    write_site_data,
)
from dpfl.data.dataset import as_model_input
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


@app.command("export")
def export_cmd(
    config: str = typer.Option(..., "--config", help="run config: a TOML file or a built-in name"),
    fmt: str = typer.Option(..., "--format", help="csv | npz | images (a folder root/<label>/*.png)"),
    client: int = typer.Option(None, "--client", help="the client id I, 0..data.n_clients-1"),
    out: Path = typer.Option(None, "--out", help="client I's training file (.csv, .npz) or image folder"),
    test_out: Path = typer.Option(None, "--test-out", help="client I's held-out share of the test set"),
    all_dir: Path = typer.Option(None, "--all", metavar="DIR", help="write every client's files into DIR"),
) -> None:
    """Write a client's partition of the configured dataset (as `dpfl run` splits it) as site data files."""
    try:
        cfg = _config(config)
        jobs = _export_jobs(fmt, client, out, test_out, all_dir, cfg.data.n_clients)
        fed = _federation(cfg)
        typer.echo(f"dataset: {fed.source}")
        parts = site_test_split(len(fed.y_test), cfg.data.n_clients, cfg.seed)
        for i, path, test in jobs:
            x, y = (fed.x_test, fed.y_test) if test else (fed.x, fed.y)
            idx = torch.from_numpy(parts[i] if test else fed.clients[i])
            x, y = as_model_input(x[idx]), y[idx]
            write_site_data(path, x, y, fmt, task=fed.task, n_classes=fed.num_classes)
            what = f"client {i}{' test' if test else ''}"
            typer.echo(f"{what}: {len(y)} examples {list(x.shape[1:])} -> {path}")
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    _export_notes(fmt, fed)


def _export_jobs(fmt: str, client: int | None, out: Path | None, test_out: Path | None, all_dir: Path | None,
                 n_clients: int) -> list[tuple[int, Path, bool]]:
    """The files to write: (client, path, held-out?) triples."""
    if fmt not in SITE_FORMATS:
        raise ConfigError(f"unknown --format {fmt!r}; allowed: {', '.join(SITE_FORMATS)}")
    ext = "" if fmt == "images" else f".{fmt}"
    if all_dir is not None:
        if client is not None or out is not None or test_out is not None:
            raise ConfigError("--all writes every client: give it without --client, --out, --test-out")
        return [(i, all_dir / f"client-{i}{suffix}{ext}", test)
                for i in range(n_clients) for suffix, test in (("", False), ("-test", True))]
    if client is None or out is None:
        raise ConfigError("give --client I and --out PATH (and optionally --test-out PATH), or --all DIR")
    if not 0 <= client < n_clients:
        raise ConfigError(f"--client must be in 0..{n_clients - 1} (data.n_clients = {n_clients}), "
                          f"got {client}")
    return [(client, out, False)] + ([(client, test_out, True)] if test_out is not None else [])


def _config(config: str):
    """A TOML path or a built-in config name (as `dpfl run` resolves it), on the CPU."""
    from dpfl.cli.main import _resolve_config
    from dpfl.config import load_config

    return load_config(_resolve_config(Path(config)), ["run.device=cpu"])


def _federation(cfg):
    """The configured dataset, partitioned as `dpfl run` does."""
    from dpfl.rng import Seeds
    from dpfl.run.state import build_federation

    return build_federation(cfg, Seeds(cfg.seed))


def _export_notes(fmt: str, fed) -> None:
    """What the reader must know about the files just written."""
    shape = list(fed.x.shape[1:])
    if fmt == "csv" and len(shape) > 1:
        typer.echo(f"note: CSV rows are flat; load them with shape={','.join(map(str, shape))} for a model "
                   f"taking {shape}")
    if fmt == "images" and not (is_8bit(fed.x) and is_8bit(fed.x_test)):
        typer.echo("note: the features are not 8-bit pixels (k/255); the PNGs hold them rounded to the "
                   "nearest k/255: use csv or npz for exact values")
