"""``dpfl privacy epsilon|sigma``: the accountants from the command line.

With ``--json`` the last line printed is one JSON object holding the numbers. ``epsilon`` accounts
Poisson sampling (rate q, add/remove neighbours) or, with ``--sampling without-replacement``, a
fixed-size sample of ``--cohort`` of ``--population`` units (replace-one neighbours). With
``--correlated tree | bandmf`` both account a correlated-noise mechanism over ``--steps`` rounds on a
participation schema (``dpfl.privacy.factorization``): the sensitivity Δ, ρ = Δ²/(2σ²), the ledger's ε
per accountant and the exact Gaussian ε of multiplier σ/Δ.
"""

from __future__ import annotations

import json
import sys

import numpy as np
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
    console.print(f"{kind} for " + ", ".join(f"{k} = {str(v).lower()}" if isinstance(v, bool) else f"{k} = {v:g}"
                                             if isinstance(v, float | int) else f"{k} = {v}"
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


_CORR_HELP = ("correlated noise across the steps: tree (DP-FTRL) | bandmf; accounted on --participation, "
              "not on sampling (no --q, --sampling, --population, --cohort)")


def _correlated(mechanism: str, steps: int, participation: str, separation: int | None, bands: int | None,
                restart: int | None, completion: bool, momentum: float | None, sampling_given: bool):
    """(Δ_r² per step, params) of a correlated mechanism, the options checked in one error line."""
    from dpfl.privacy.factorization import build

    if sampling_given:
        raise typer.BadParameter("correlated noise is accounted on --participation, not on sampling: drop --q, "
                                 "--sampling, --population and --cohort", param_hint="--correlated")
    wrong = [f for f, v, m in (("--bands", bands, "bandmf"), ("--workload-momentum", momentum, "bandmf"),
                               ("--restart", restart, "tree"), ("--no-completion", None if completion else 1, "tree"))
             if v is not None and mechanism != m]
    if wrong:
        raise typer.BadParameter(f"{', '.join(wrong)} do(es) not apply to --correlated {mechanism}",
                                 param_hint="--correlated")
    sep = 1 if participation == "any" and separation is None else separation
    if sep is None:
        raise typer.BadParameter(f"--participation {participation} needs --separation b (its groups or "
                                 "minimum gap)", param_hint="--separation")
    f, sens2, exact = _run(lambda: build(mechanism, steps, participation, sep, bands=bands, restart=restart,
                                         completion=completion, workload_momentum=momentum))
    params = {"correlated": mechanism, "participation": participation, "separation": sep, "steps": steps}
    if mechanism == "bandmf":
        params["bands"] = f.bands
    else:
        params.update(restart=restart or "none", completion=completion)
    pv = f.prefix_variances()  # the noise variance of each prefix sum (the model after round t), per σ²
    params.update(sensitivity=float(np.sqrt(sens2[-1])), sensitivity_exact=exact, neighbouring="add_remove",
                  prefix_variance=float(pv.mean()), prefix_variance_first=float(pv[0]),
                  prefix_variance_last=float(pv[-1]))
    return sens2, params


_CORR = {
    "correlated": typer.Option(None, "--correlated", help=_CORR_HELP),
    "participation": typer.Option("any", "--participation",
                                  help="correlated noise: any (a client in every step) | cyclic (--separation "
                                       "groups take turns) | min-separation (a client's steps ≥ --separation apart)"),
    "separation": typer.Option(None, "--separation", help="b: the groups (cyclic) or minimum gap (min-separation)"),
    "bands": typer.Option(None, "--bands", help="bandmf: bands (default: --separation)"),
    "restart": typer.Option(None, "--restart", help="tree: steps per tree (default: one tree)"),
    "completion": typer.Option(True, "--completion/--no-completion", help="tree: completion at each restart"),
    "momentum": typer.Option(None, "--workload-momentum", help="bandmf: optimise for server momentum β"),
}


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
    correlated: str | None = _CORR["correlated"],
    participation: str = _CORR["participation"],
    separation: int | None = _CORR["separation"],
    bands: int | None = _CORR["bands"],
    restart: int | None = _CORR["restart"],
    completion: bool = _CORR["completion"],
    momentum: float | None = _CORR["momentum"],
):
    """epsilon after STEPS subsampled Gaussian steps (Poisson, or without replacement), or of a correlated
    noise mechanism (--correlated tree | bandmf) over STEPS rounds."""
    names = _backends(accountant)
    if correlated is not None:
        from dpfl.privacy.composition import gaussian_zcdp, zcdp_to_dp
        from dpfl.privacy.factorization import gaussian_epsilon, run_epsilon

        sens2, params = _correlated(correlated, steps, participation, separation, bands, restart, completion,
                                    momentum, q is not None or sampling != "poisson" or population is not None
                                    or cohort is not None)
        rho = _run(lambda: gaussian_zcdp(sigma, params["sensitivity"]))
        params.update(sigma=sigma, delta=delta, rho=rho, epsilon_zcdp=_run(lambda: zcdp_to_dp(rho, delta)),
                      epsilon_exact=_run(lambda: gaussian_epsilon(sigma / params["sensitivity"], delta)))
        values = _run(lambda: {n: run_epsilon(sigma, sens2, delta, n) for n in names})
        _emit("epsilon", "epsilon", values, params, as_json)
        return
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
    q: float | None = typer.Option(None, "--q", help="sampling probability per step, in (0, 1] (not with "
                                                     "--correlated)"),
    steps: int = typer.Option(..., "--steps", help="number of steps (rounds)"),
    delta: float = typer.Option(1e-5, "--delta", help="target delta, in (0, 1)"),
    accountant: str = typer.Option("all", "--accountant", help=_ACC_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object as the last line"),
    correlated: str | None = _CORR["correlated"],
    participation: str = _CORR["participation"],
    separation: int | None = _CORR["separation"],
    bands: int | None = _CORR["bands"],
    restart: int | None = _CORR["restart"],
    completion: bool = _CORR["completion"],
    momentum: float | None = _CORR["momentum"],
):
    """Smallest noise multiplier reaching EPSILON after STEPS steps (of a correlated mechanism with
    --correlated: the std of Z per unit of the clip bound, σ in ρ = Δ²/(2σ²))."""
    names = _backends(accountant)
    if correlated is not None:
        from dpfl.privacy.calibration import analytic_gaussian_sigma
        from dpfl.privacy.factorization import calibrate

        sens2, params = _correlated(correlated, steps, participation, separation, bands, restart, completion,
                                    momentum, q is not None)
        params.update(epsilon=epsilon, delta=delta, sigma_exact=_run(
            lambda: analytic_gaussian_sigma(epsilon, delta, params["sensitivity"])))
        values = _run(lambda: {n: calibrate(epsilon, delta, sens2, n) for n in names})
        _emit("sigma", "sigma", values, params, as_json)
        return
    if q is None:
        raise typer.BadParameter("give --q (or --correlated tree | bandmf)", param_hint="--q")
    values = _run(lambda: {n: calibrate_sigma(epsilon, delta, q, steps, n) for n in names})
    _emit("sigma", "sigma", values, {"epsilon": epsilon, "q": q, "steps": steps, "delta": delta}, as_json)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
