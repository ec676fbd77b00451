"""Sampling without replacement: the ledger against dp-accounting directly, what each accountant
supports, and `dpfl privacy epsilon --sampling`."""

import json

import dp_accounting as dpa
import pytest
from typer.testing import CliRunner

from dpfl.cli.privacy import app
from dpfl.errors import PrivacyError
from dpfl.privacy import (
    ACCOUNTANTS,
    Ledger,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    epsilon_for,
    epsilon_without_replacement,
    event_from_dict,
)
from dpfl.privacy.events import SAMPLINGS, sampling_neighbouring, subsampled_gaussian
from dpfl.privacy.ledger import SUPPORTED_SAMPLINGS
from dpfl.privacy.rdp import MOMENTS_ORDERS

ORDERS = [1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64]  # a small grid: fast


def _dpa_epsilon(sigma_over_c, population, sample, steps, delta, orders):
    """dp-accounting's own RDP accountant, replace-one neighbours. The sum of clipped rows moves by up
    to 2C when one unit is replaced, so its noise multiplier (std / sensitivity) is sigma / 2."""
    acc = dpa.rdp.RdpAccountant(orders=list(orders), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    event = dpa.SampledWithoutReplacementDpEvent(population, sample, dpa.GaussianDpEvent(sigma_over_c / 2))
    acc.compose(dpa.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("sigma,n,m,steps", [(1.2, 6000, 100, 200), (2.0, 60, 6, 10), (0.9, 1000, 250, 30)])
def test_ledger_matches_dp_accounting_for_sampling_without_replacement(sigma, n, m, steps):
    led = Ledger("rdp", "replace_one", orders=ORDERS)
    led.add(SampledWithoutReplacementGaussianEvent(sigma, n, m), count=steps)
    assert led.epsilon(1e-5) == pytest.approx(_dpa_epsilon(sigma, n, m, steps, 1e-5, ORDERS), rel=1e-9)


def test_moments_accountant_uses_the_same_curve_with_its_classic_conversion():
    led = Ledger("moments", "replace_one")
    led.add(SampledWithoutReplacementGaussianEvent(1.2, 6000, 100), count=200)
    ref = _dpa_epsilon(1.2, 6000, 100, 200, 1e-5, MOMENTS_ORDERS)  # improved conversion: a bit smaller
    assert ref < led.epsilon(1e-5) < 1.15 * ref


def test_without_replacement_is_not_the_poisson_number():
    wor = epsilon_without_replacement(1.2, 6000, 100, 200, 1e-5, "moments")
    poisson = epsilon_for(1.2, 100 / 6000, 200, 1e-5, "moments")
    assert wor > 2 * poisson  # replace-one neighbours (sensitivity 2C) and a looser bound


def test_which_accountant_supports_which_sampling_is_what_the_ledger_does():
    for acc in ACCOUNTANTS:
        for sampling in SAMPLINGS:
            led = Ledger(acc, sampling_neighbouring(sampling), orders=ORDERS if acc == "rdp" else None)
            event = subsampled_gaussian(2.0, sampling, 60, 6)
            if sampling in SUPPORTED_SAMPLINGS[acc]:
                led.add(event, count=3)
                assert led.epsilon(1e-5) > 0
            else:
                with pytest.raises(PrivacyError, match="cannot account sampling without replacement"):
                    led.add(event)
    assert SUPPORTED_SAMPLINGS["pld"] == ("poisson",)


def test_the_event_refuses_add_remove_neighbours_and_bad_sizes():
    with pytest.raises(PrivacyError, match="replace_one neighbours only"):
        Ledger("rdp", "add_remove").add(SampledWithoutReplacementGaussianEvent(1.0, 60, 6))
    with pytest.raises(PrivacyError, match="exceeds population"):
        SampledWithoutReplacementGaussianEvent(1.0, 6, 60)
    with pytest.raises(PrivacyError, match="sampling must be one of"):
        subsampled_gaussian(1.0, "fixed", 60, 6)


def test_event_round_trips_and_poisson_helper_is_the_old_event():
    e = SampledWithoutReplacementGaussianEvent(1.5, 6000, 100)
    assert event_from_dict(json.loads(json.dumps(e.to_dict()))) == e and e.q == 100 / 6000
    assert subsampled_gaussian(1.5, "poisson", 6000, 100) == SampledGaussianEvent(1.5, 100 / 6000)


# ---- the CLI ----------------------------------------------------------------------------------

runner = CliRunner()
WOR = ["epsilon", "--sigma", "2.0", "--steps", "10", "--sampling", "without-replacement",
       "--population", "60", "--cohort", "6"]


def _last_json(res):
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def test_cli_without_replacement_all_accountants_name_which_support_it():
    out = _last_json(runner.invoke(app, WOR + ["--accountant", "all", "--json"]))
    assert out["sampling"] == "without-replacement" and out["neighbouring"] == "replace_one"
    assert out["pld"] is None and "pld" in out["unsupported"]
    # the ledger itself is checked against dp-accounting above (on a small grid: the full one is slow)
    assert out["rdp"] == epsilon_without_replacement(2.0, 60, 6, 10, 1e-5, "rdp")
    assert out["moments"] == pytest.approx(epsilon_without_replacement(2.0, 60, 6, 10, 1e-5, "moments"))
    table = runner.invoke(app, WOR + ["--accountant", "all"])
    assert table.exit_code == 0 and "not supported" in table.output and "replace_one" in table.output


def test_cli_pld_without_replacement_is_one_error_line():
    res = runner.invoke(app, WOR + ["--accountant", "pld"])
    assert res.exit_code == 2 and "error:" in res.output and "without replacement" in res.output
    assert "Traceback" not in res.output


def test_cli_poisson_states_its_assumption_and_takes_population_and_cohort():
    out = _last_json(runner.invoke(app, ["epsilon", "--sigma", "2.0", "--steps", "10", "--population", "60",
                                         "--cohort", "6", "--accountant", "moments", "--json"]))
    assert out["sampling"] == "poisson" and out["neighbouring"] == "add_remove" and out["q"] == 0.1
    assert out["epsilon"] == epsilon_for(2.0, 0.1, 10, 1e-5, "moments")


@pytest.mark.parametrize("args", [
    ["--sampling", "without-replacement", "--q", "0.1"],
    ["--sampling", "without-replacement", "--population", "60"],
    ["--sampling", "uniform", "--q", "0.1"],
    [],
])
def test_cli_bad_sampling_arguments_are_refused(args):
    res = runner.invoke(app, ["epsilon", "--sigma", "2.0", "--steps", "10", *args])
    assert res.exit_code == 2 and "Traceback" not in res.output
