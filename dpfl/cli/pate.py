"""`dpfl pate ...`: privacy analysis of PATE label queries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import DataError, DpflError
from dpfl.pate.analysis import GaussianOptions, analyze
from dpfl.pate.votes import vote_counts
from dpfl.rng import CryptoRNG, Seeds

app = typer.Typer(help="PATE: privacy analysis of noisy-max label queries.", no_args_is_help=True)
KINDS = ("preds", "counts")


@app.callback()
def _group() -> None:
    """PATE: privacy analysis of noisy-max label queries."""


def load_array(path: Path, key: str | None = None) -> np.ndarray:
    """Read a matrix or vector from .npy, .npz (by `key`) or .csv (comma separated)."""
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, allow_pickle=False)
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            if key not in z:
                raise DataError(f"{path} has no array {key!r}; it holds {sorted(z.files)}")
            return z[key]
    if suffix == ".csv":
        return np.loadtxt(path, delimiter=",", ndmin=1)
    raise DataError(f"{path}: unsupported file type {suffix!r}; use .npy, .npz or .csv")


def read_votes(
    path: Path, kind: str | None, num_classes: int | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(counts, indices, labels) from a votes file.

    .npz: arrays `teacher_preds` [teachers, examples] or `counts` [examples, classes], and
    optionally `indices` and `labels`. .npy/.csv: one matrix whose meaning `kind` states.
    """
    if path.suffix.lower() == ".npz":
        with np.load(path, allow_pickle=False) as z:
            files = set(z.files)
            if ("teacher_preds" in files) == ("counts" in files):
                raise DataError(
                    f"{path} must hold exactly one of 'teacher_preds' or 'counts', has {sorted(files)}"
                )
            counts = vote_counts(z["teacher_preds"], num_classes) if "teacher_preds" in files else z["counts"]
            return (
                counts,
                z["indices"] if "indices" in files else None,
                z["labels"] if "labels" in files else None,
            )
    if kind not in KINDS:
        raise DataError(
            f"--kind must be one of {KINDS} for {path.suffix} input (a matrix is ambiguous otherwise)"
        )
    mat = load_array(path)
    if kind == "preds":
        return vote_counts(mat, num_classes), None, None
    return mat, None, None


def int_vector(a: np.ndarray, what: str) -> np.ndarray:
    """A 1-D int64 array from integer-valued input; non-integers are an error, not rounded."""
    a = np.asarray(a).ravel()
    if a.dtype.kind == "f" and not np.all(np.equal(np.mod(a, 1), 0)):
        raise DataError(f"{what} must be integers, got non-integer values")
    return a.astype(np.int64)


@app.command("analyze")
def analyze_cmd(
    votes: Annotated[
        Path,
        typer.Argument(help=".npz (teacher_preds or counts [+ indices, labels]), or .npy/.csv with --kind"),
    ],
    kind: str = typer.Option(
        None, help="for .npy/.csv: 'preds' = [teachers, examples] predictions, 'counts' = [examples, classes]"
    ),
    indices: Annotated[
        Path | None, typer.Option(help="queried example rows (.npy/.csv); default: every example")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="released labels, one per queried index (.npy/.csv)")
    ] = None,
    mechanism: str = typer.Option(
        "lnmax",
        "--mechanism",
        "--aggregator",
        help="lnmax (noise = γ, Laplace 1/γ), gnmax (noise = σ) or confident-gnmax (noise = σ2)",
    ),
    noise: float = typer.Option(0.05, help="γ for lnmax, σ for gnmax, σ2 for confident-gnmax"),
    threshold: float = typer.Option(
        None, help="confident-gnmax: threshold T of step 1 (-inf: always answer)"
    ),
    sigma1: float = typer.Option(None, help="confident-gnmax: σ1 of step 1"),
    threshold_data_independent: bool = typer.Option(
        False, help="confident-gnmax: charge step 1 data-independently (α/(2σ1²))"
    ),
    order: float = typer.Option(
        None, help="gnmax types: Rényi order of the release (default: data-dependent optimum)"
    ),
    ss_sigma: float = typer.Option(5.0, help="gnmax types: σ_s of the release noise SS·N(0, σ_s²)"),
    delta: float = typer.Option(1e-5, help="target δ"),
    moments: int = typer.Option(8, help="lnmax: moments l = 1..moments"),
    beta: float = typer.Option(
        None, help="smoothness β of the release (default: lnmax 0.09, gnmax 0.4/order)"
    ),
    num_classes: int = typer.Option(None, help="number of classes (default: largest prediction + 1)"),
    seed: int = typer.Option(None, help="seed the release noise (simulation); default: OS randomness"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Data-independent and data-dependent ε of the queried labels."""
    try:
        counts, idx, lab = read_votes(votes, kind, num_classes)
        if indices is not None:
            idx = int_vector(load_array(indices, "indices"), "indices")
        if labels is not None:
            lab = int_vector(load_array(labels, "labels"), "labels")
        rng = CryptoRNG() if seed is None else Seeds(seed).crypto("pate", "release")
        report = analyze(
            counts,
            indices=idx,
            labels=lab,
            mechanism=mechanism,
            noise=noise,
            delta=delta,
            moments=moments,
            beta=beta,
            rng=rng,
            gauss=GaussianOptions(threshold, sigma1, threshold_data_independent, order, None, ss_sigma),
        )
    except DpflError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return
    t = Table(title=f"PATE {mechanism}: {report.queries} queries, {report.teachers} teachers, δ = {delta:g}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row(
        "ε data-independent", f"{report.eps_data_independent:.4f} (order {report.order_data_independent:g})"
    )
    t.add_row(
        "ε data-dependent (raw, not private)",
        f"{report.eps_data_dependent:.4f} (order {report.order_data_dependent:g})",
    )
    if report.answered is not None:
        t.add_row("queries answered (charged for noisy argmax)", f"{report.answered}")
    if report.release_order is not None and report.eps_data_dependent_released is not None:
        t.add_row(
            f"ε data-dependent at release order {report.release_order:g} (raw)",
            f"{report.eps_data_dependent_at_order:.4f}",
        )
        t.add_row(
            "ε data-dependent, smooth-sensitivity release",
            f"{report.eps_data_dependent_released:.4f}",
        )
        t.add_row(
            "  release (GNSS)",
            f"SS = {report.smooth_sensitivity:.4g}, β = {report.beta:.4g}, σ_s = {report.ss_sigma:g}, "
            f"own RDP {report.release_rdp:.4f} (included)",
        )
    elif report.eps_data_dependent_released is not None:
        t.add_row("ε data-dependent, smooth-sensitivity release", f"{report.eps_data_dependent_released:.4f}")
        t.add_row(
            "  release cost",
            f"({report.release_epsilon:.4f}, {delta:g})-DP, β = {beta}, SS = {report.smooth_sensitivity:.4g}",
        )
    if report.label_agreement is not None:
        t.add_row("released labels = plurality", f"{report.label_agreement:.2%}")
    Console().print(t)
    for w in report.warnings:
        typer.echo(f"warning: {w}", err=True)
