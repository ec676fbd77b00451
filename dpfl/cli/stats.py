"""`dpfl stats mean|count|histogram`: DP statistics of one column of a built-in data set or a CSV.

The DP estimate and the ε spent are printed; the true (non-private) value only with --show-true,
for demonstrations.
"""

from __future__ import annotations

import math

import numpy as np
import typer

from dpfl.classic.tables import BUILTIN, Table, load_table
from dpfl.errors import ConfigError, DpflError
from dpfl.privacy.events import check_delta
from dpfl.stats.inputs import check_epsilon

app = typer.Typer(help="DP statistics of a column: mean and std, count, histogram.", no_args_is_help=True)

_DATA = typer.Option("diabetes", "--data", help=f"{' | '.join(BUILTIN)} or a CSV file with a header")
_COLUMN = typer.Option(..., "--column", help="the column (built-in data sets: their feature names, or target)")
_EPS = typer.Option(..., "--epsilon", help="privacy budget ε (> 0)")
_SEED = typer.Option(None, "--seed", help="seed of the noise (default: from the OS)")
_SHOW = typer.Option(False, "--show-true", help="also print the true value (demonstrations only)")


@app.callback()
def _group() -> None:
    """DP statistics of a column: mean and std, count, histogram."""


def _run(fn) -> None:
    try:
        fn()
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def _delta(delta: float | None) -> float:
    return check_delta(1e-5 if delta is None else delta, "--delta")


def _range(lo: float | None, hi: float | None, what: str) -> None:
    for name, v in ((f"--{what[0]}", lo), (f"--{what[1]}", hi)):
        if v is not None and not math.isfinite(v):
            raise ConfigError(f"{name} must be a finite number, got {v}")
    if lo is not None and hi is not None and not lo < hi:
        raise ConfigError(f"--{what[0]} must be below --{what[1]}, got {lo} and {hi}")


@app.command()
def mean(
    column: str = _COLUMN,
    epsilon: float = _EPS,
    lower: float = typer.Option(..., "--lower", help="public lower bound of the column (values are clipped)"),
    upper: float = typer.Option(..., "--upper", help="public upper bound of the column"),
    data: str = _DATA,
    seed: int = _SEED,
    show_true: bool = _SHOW,
) -> None:
    """ε-DP mean and standard deviation (Laplace; half of ε each; n public)."""

    def go():
        from dpfl.stats import dp_mean_std
        from dpfl.stats.ledger import pure_epsilon

        eps = check_epsilon(epsilon, "--epsilon")
        _range(lower, upper, ("lower", "upper"))
        x = load_table(data).numeric(column)
        r = dp_mean_std([x[:, None]], eps, (lower, upper), random_state=seed)
        typer.echo(f"{column} in {data}: {r.n} rows (public), clipped to [{lower:g}, {upper:g}]")
        typer.echo(f"DP mean {r.mean[0]:.6g}, DP std {r.std[0]:.6g}")
        if show_true:
            c = np.clip(x, lower, upper)
            typer.echo(f"true (not private; clipped): mean {c.mean():.6g}, std {c.std():.6g}")
        typer.echo(f"ε spent: {pure_epsilon(r.ledger):.6g} (ε-DP, replace-one neighbours; from the privacy ledger)")

    _run(go)


@app.command()
def count(
    column: str = _COLUMN,
    epsilon: float = _EPS,
    min_: float = typer.Option(None, "--min", help="count the rows with column >= MIN"),
    max_: float = typer.Option(None, "--max", help="count the rows with column <= MAX"),
    delta: float = typer.Option(None, "--delta", help="δ of the (ε, δ) guarantee (default 1e-5)"),
    data: str = _DATA,
    seed: int = _SEED,
    show_true: bool = _SHOW,
) -> None:
    """(ε, δ)-DP count of the rows in a range (SuLQ: Gaussian noise, σ calibrated by the PLD accountant)."""

    def go():
        from dpfl.privacy.calibration import calibrate_sigma
        from dpfl.privacy.ledger import Ledger
        from dpfl.stats import SuLQ

        eps, dlt = check_epsilon(epsilon, "--epsilon"), _delta(delta)
        if min_ is None and max_ is None:
            raise ConfigError("give --min, --max or both")
        _range(min_, max_, ("min", "max"))
        x = load_table(data).numeric(column)
        lo, hi = -math.inf if min_ is None else min_, math.inf if max_ is None else max_
        # a count moves by at most 1 when one record is replaced (or added / removed)
        sigma = calibrate_sigma(eps, dlt, 1.0, 1, "pld", "add_remove")
        q = SuLQ([x], sigma=sigma, random_state=seed, ledger=Ledger("pld", "replace_one"))
        noisy = q.query(lambda rows: ((rows >= lo) & (rows <= hi)).astype(np.int64))
        where = " and ".join(s for s in (min_ is not None and f"{column} >= {min_:g}",
                                          max_ is not None and f"{column} <= {max_:g}") if s)
        typer.echo(f"rows of {data} with {where}: DP count {noisy:.6g} (Gaussian σ = {sigma:.4g})")
        if show_true:
            typer.echo(f"true (not private): {int(np.sum((x >= lo) & (x <= hi)))}")
        typer.echo(f"ε spent: {q.ledger.epsilon(dlt):.6g} at δ = {dlt:g} (PLD accountant, replace-one neighbours)")

    _run(go)


def _split(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    if any(p == "" for p in parts):
        raise ConfigError(f"empty item in the list {text!r}")
    return parts


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(p) for p in _split(text)]
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated numbers, got {text!r}") from None


def _key(k) -> str:
    if isinstance(k, tuple):
        return f"[{k[0]:g}, {k[1]:g})"
    return f"{k:g}" if isinstance(k, float) else str(k)


@app.command()
def histogram(
    column: str = _COLUMN,
    epsilon: float = _EPS,
    bins: str = typer.Option(None, "--bins", help="known domain: bin edges, e.g. 20,40,60,80 (last bin closed)"),
    categories: str = typer.Option(None, "--categories", help="known domain: the categories, e.g. 1,2"),
    stable: bool = typer.Option(False, "--stable", help="unknown domain: noisy counts of the values present, "
                                                        "released above a threshold (needs δ)"),
    noise: str = typer.Option(None, "--noise", help="known domain: laplace (default) | discrete_laplace"),
    delta: float = typer.Option(None, "--delta", help="--stable only: δ (default 1e-5)"),
    nonneg: bool = typer.Option(False, "--nonneg", help="round the counts and clip them at 0 (post-processing)"),
    data: str = _DATA,
    seed: int = _SEED,
    show_true: bool = _SHOW,
) -> None:
    """DP histogram (add/remove neighbours, one record in one bin): known domain (ε-DP) or --stable ((ε, δ)-DP)."""

    def go():
        from dpfl.stats import dp_histogram, stable_histogram
        from dpfl.stats.ledger import pure_epsilon

        eps = check_epsilon(epsilon, "--epsilon")
        if sum([bins is not None, categories is not None, stable]) != 1:
            raise ConfigError("give exactly one of --bins, --categories or --stable")
        if delta is not None and not stable:
            raise ConfigError("--delta applies to --stable only (the known-domain histogram is ε-DP)")
        if noise is not None and stable:
            raise ConfigError("--noise applies to --bins / --categories (--stable uses Laplace noise)")
        table: Table = load_table(data)
        if bins is not None:
            x = table.numeric(column)
            h = dp_histogram(x, eps, bins=_numbers(bins, "--bins"), noise=noise or "laplace",
                             postprocess=nonneg, random_state=seed)
        else:
            col = table.column(column)
            x = table.numeric(column) if col.dtype.kind == "f" else col
            if stable:
                h = stable_histogram(x, eps, _delta(delta), postprocess=nonneg, random_state=seed)
            else:
                cats = _numbers(categories, "--categories") if x.dtype.kind == "f" else _split(categories)
                h = dp_histogram(x, eps, categories=cats, noise=noise or "laplace", postprocess=nonneg,
                                 random_state=seed)
        if stable:
            typer.echo(f"{column} in {data}: values present, released when the noisy count >= τ = "
                       f"{h.threshold:.4g}")
        else:
            typer.echo(f"{column} in {data}: {len(h.keys)} bins ({h.mechanism} noise on every bin)")
        true = _true_counts(x, h.keys) if show_true else None
        typer.echo(f"{'bin':>16s} {'DP count':>10s}" + (f" {'true':>6s}" if show_true else ""))
        for i, (k, c) in enumerate(zip(h.keys, h.counts)):
            typer.echo(f"{_key(k):>16s} {c:>10.6g}" + (f" {true[i]:>6d}" if show_true else ""))
        if not h.keys:
            typer.echo(f"{'(none)':>16s}")
        if stable:
            typer.echo(f"ε spent: {h.epsilon:g} at δ = {h.delta:g} ((ε, δ)-DP, add/remove neighbours)")
        else:
            typer.echo(f"ε spent: {pure_epsilon(h.ledger):.6g} (ε-DP, add/remove neighbours; from the privacy ledger)")

    _run(go)


def _true_counts(x: np.ndarray, keys: list) -> list[int]:
    out = []
    for i, k in enumerate(keys):
        if isinstance(k, tuple):  # np.histogram's bins: [lo, hi), the last one [lo, hi]
            last = i == len(keys) - 1
            out.append(int(np.sum((x >= k[0]) & ((x <= k[1]) if last else (x < k[1])))))
        else:
            out.append(int(np.sum(x == k)))
    return out
