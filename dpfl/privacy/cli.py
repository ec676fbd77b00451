"""``dpfl privacy epsilon|sigma``: the accountants from the command line.

With ``--json`` the last line printed is one JSON object holding the numbers.
"""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table

from dpfl.errors import DpflError
from dpfl.privacy.calibration import calibrate_sigma, epsilon_for
from dpfl.privacy.ledger import ACCOUNTANTS

app = typer.Typer(
    help="Privacy accounting: epsilon for a noise level, or the noise for a target epsilon.",
    no_args_is_help=True,
)

_ACC_HELP = "moments (thesis, lam <= 32) | rdp | pld | all"


def _backends(accountant: str) -> list[str]:
    if accountant == "all":
        return list(ACCOUNTANTS)
    if accountant not in ACCOUNTANTS:
        raise typer.BadParameter(
            f"must be one of {ACCOUNTANTS + ('all',)}, got {accountant!r}", param_hint="--accountant"
        )
    return [accountant]


def _emit(kind: str, value_key: str, values: dict[str, float], params: dict, as_json: bool) -> None:
    if as_json:
        if len(values) == 1:
            ((name, v),) = values.items()
            out = {"accountant": name, value_key: v, **params}
        else:
            out = {"accountant": "all", **values, **params}
        print(json.dumps(out))
        return
    console = Console()
    # the parameters on a line of their own: as the table's title they wrapped to its narrow width
    console.print(f"{kind} for " + ", ".join(f"{k} = {v:g}" for k, v in params.items()), highlight=False)
    table = Table()
    table.add_column("accountant")
    table.add_column(value_key, justify="right")
    for name, v in values.items():
        table.add_row(name, f"{v:.4f}")
    console.print(table)


def _run(fn):
    try:
        return fn()
    except DpflError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        raise typer.Exit(code=2) from None


@app.command()
def epsilon(
    sigma: float = typer.Option(..., "--sigma", help="noise multiplier (std / sensitivity)"),
    q: float = typer.Option(..., "--q", help="sampling probability per step, in (0, 1]"),
    steps: int = typer.Option(..., "--steps", help="number of steps (rounds)"),
    delta: float = typer.Option(1e-5, "--delta", help="target delta, in (0, 1)"),
    accountant: str = typer.Option("all", "--accountant", help=_ACC_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object as the last line"),
):
    """epsilon after STEPS Poisson-subsampled Gaussian steps."""
    names = _backends(accountant)
    values = _run(lambda: {n: epsilon_for(sigma, q, steps, delta, n) for n in names})
    _emit("epsilon", "epsilon", values, {"sigma": sigma, "q": q, "steps": steps, "delta": delta}, as_json)


@app.command()
def sigma(
    epsilon: float = typer.Option(..., "--epsilon", help="target epsilon (> 0)"),
    q: float = typer.Option(..., "--q", help="sampling probability per step, in (0, 1]"),
    steps: int = typer.Option(..., "--steps", help="number of steps (rounds)"),
    delta: float = typer.Option(1e-5, "--delta", help="target delta, in (0, 1)"),
    accountant: str = typer.Option("all", "--accountant", help=_ACC_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object as the last line"),
):
    """Smallest noise multiplier reaching EPSILON after STEPS steps."""
    names = _backends(accountant)
    values = _run(lambda: {n: calibrate_sigma(epsilon, delta, q, steps, n) for n in names})
    _emit("sigma", "sigma", values, {"epsilon": epsilon, "q": q, "steps": steps, "delta": delta}, as_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
