"""``dpfl privacy epsilon|sigma``: the accountants from the command line.

With ``--json`` the last line printed is one JSON object holding the numbers. ``epsilon`` accounts
Poisson sampling (rate q, add/remove neighbours) or, with ``--sampling without-replacement``, a
fixed-size sample of ``--cohort`` of ``--population`` units (replace-one neighbours).
"""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console

from dpfl.errors import DpflError
from dpfl.privacy.calibration import calibrate_sigma, epsilon_for, epsilon_without_replacement
from dpfl.privacy.events import SAMPLINGS, sampling_neighbouring
from dpfl.privacy.ledger import ACCOUNTANTS, SUPPORTED_SAMPLINGS

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


def _emit(kind: str, value_key: str, values: dict[str, float | None], params: dict, as_json: bool,
          unsupported: dict[str, str] | None = None) -> None:
    """``values[name] is None``: accountant ``name`` cannot account it; ``unsupported[name]`` says why."""
    unsupported = unsupported or {}
    if as_json:
        if len(values) == 1:
            ((name, v),) = values.items()
            out = {"accountant": name, value_key: v, **params}
        else:
            out = {"accountant": "all", **values, **params}
            if unsupported:
                out["unsupported"] = unsupported
        print(json.dumps(out))
        return
    from rich.table import Table  # here: --json needs no table

    console = Console()
    # the parameters on a line of their own: as the table's title they wrapped to its narrow width
    console.print(f"{kind} for " + ", ".join(f"{k} = {v:g}" if isinstance(v, float | int) else f"{k} = {v}"
                                             for k, v in params.items()), highlight=False)
    table = Table()
    table.add_column("accountant")
    table.add_column(value_key, justify="right")
    for name, v in values.items():
        table.add_row(name, f"{v:.4f}" if v is not None else "not supported")
    console.print(table)


def _run(fn):
    try:
        return fn()
    except DpflError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        raise typer.Exit(code=2) from None


def _sampling_params(sampling: str, q: float | None, population: int | None, cohort: int | None) -> dict:
    if sampling not in SAMPLINGS:
        raise typer.BadParameter(f"must be one of {SAMPLINGS}, got {sampling!r}", param_hint="--sampling")
    if (population is None) != (cohort is None):
        raise typer.BadParameter("give both --population and --cohort, or neither", param_hint="--cohort")
    if sampling == "poisson":
        if (q is None) == (population is None):
            raise typer.BadParameter("Poisson sampling needs --q, or --population and --cohort (q = cohort / "
                                     "population), not both", param_hint="--q")
        q = q if q is not None else cohort / population
        return {"sampling": sampling, "neighbouring": sampling_neighbouring(sampling), "q": q}
    if population is None or q is not None:
        raise typer.BadParameter("sampling without replacement needs --population N and --cohort M "
                                 "(no --q: it is M / N)", param_hint="--population")
    return {"sampling": sampling, "neighbouring": sampling_neighbouring(sampling),
            "population": population, "cohort": cohort}


@app.command()
def epsilon(
    sigma: float = typer.Option(..., "--sigma", help="noise multiplier (std / sensitivity)"),
    steps: int = typer.Option(..., "--steps", help="number of steps (rounds)"),
    q: float | None = typer.Option(None, "--q", help="Poisson sampling probability per step, in (0, 1]"),
    sampling: str = typer.Option(
        "poisson", "--sampling",
        help="poisson (each unit with probability q; add/remove neighbours) | without-replacement "
             "(a fixed-size sample of --cohort of --population; replace-one neighbours)"),
    population: int | None = typer.Option(None, "--population", help="units sampled from (N)"),
    cohort: int | None = typer.Option(None, "--cohort", help="units drawn per step (M)"),
    delta: float = typer.Option(1e-5, "--delta", help="target delta, in (0, 1)"),
    accountant: str = typer.Option(
        "rdp", "--accountant",
        help=_ACC_HELP + " (default rdp; pld is the tightest: dp-accounting's PLD algorithm, in numpy)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object as the last line"),
):
    """epsilon after STEPS subsampled Gaussian steps (Poisson, or without replacement)."""
    names = _backends(accountant)
    params = _sampling_params(sampling, q, population, cohort)
    unsupported = {n: f"{n} cannot account {sampling} sampling" for n in names
                   if sampling not in SUPPORTED_SAMPLINGS[n]}
    if len(names) == 1 and unsupported:
        _run(lambda: epsilon_without_replacement(sigma, population, cohort, steps, delta, names[0]))

    def one(n: str) -> float | None:
        if n in unsupported:
            return None
        if sampling == "poisson":
            return epsilon_for(sigma, params["q"], steps, delta, n)
        return epsilon_without_replacement(sigma, population, cohort, steps, delta, n)

    values = _run(lambda: {n: one(n) for n in names})
    _emit("epsilon", "epsilon", values, {"sigma": sigma, **params, "steps": steps, "delta": delta}, as_json,
          unsupported)


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
