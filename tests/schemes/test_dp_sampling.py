"""Which client sampling a DP run's ε accounts, and that the run says so (screen, summary, metrics)."""

import json

import pytest

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.privacy import epsilon_for, epsilon_without_replacement
from dpfl.run.state import Run


def _cfg(scheme="fl-std-dp", rounds=2, accountant="moments", privacy=None, federation=None, **opts):
    base = {"sigma": 1.5, "gamma": 0.01} if scheme == "fl-sign-dp" else {"sigma": 1.5, "clip": 0.5}
    opts = {k: v for k, v in {**base, **opts}.items() if v is not None}
    return load_config(data={
        "name": "dp-sampling", "seed": 3,
        "data": {"dataset": "digits", "n_clients": 60},
        "federation": {"rounds": rounds, "clients_per_round": 6, **(federation or {})},
        "train": {"steps": 1, "batch_size": 10, "lr": 0.1},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 8}},
        "scheme": {"name": scheme, "options": opts},
        "privacy": {"accountant": accountant, "delta": 1e-5, **(privacy or {})},
        "run": {"threads": 1},
    })


def _run(cfg, out):
    lines = []
    summary = simulate(Run(cfg, out, log=lines.append))
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "summary.json").read_text())["epsilon_sampling"] == summary["epsilon_sampling"]
    return summary, metrics, "\n".join(lines)


def test_a_fixed_cohort_is_accounted_without_replacement_and_the_run_says_so(tmp_path):
    summary, metrics, screen = _run(_cfg(), tmp_path)
    assert summary["epsilon_sampling"] == "without-replacement"
    assert summary["epsilon_neighbouring"] == "replace_one"
    assert "6 of 60 clients sampled without replacement" in screen and "replace-one" in screen
    assert [m["epsilon_sampling"] for m in metrics] == ["without-replacement"] * 2
    assert [m["epsilon"] for m in metrics] == [
        pytest.approx(epsilon_without_replacement(1.5, 60, 6, r, 1e-5, "moments"), rel=1e-12) for r in (1, 2)]
    assert metrics[-1]["epsilon"] > epsilon_for(1.5, 0.1, 2, 1e-5, "moments")


def test_the_stated_poisson_assumption_is_named_as_an_assumption(tmp_path):
    summary, metrics, screen = _run(_cfg(privacy={"sampling_assumption": "poisson"}), tmp_path)
    assert summary["epsilon_sampling"] == "poisson" and summary["epsilon_neighbouring"] == "add_remove"
    assert "assumed" in summary["epsilon_note"] and "fixed cohort" in screen
    assert [m["epsilon_sampling"] for m in metrics] == ["poisson"] * 2
    assert [m["epsilon"] for m in metrics] == [
        pytest.approx(epsilon_for(1.5, 0.1, r, 1e-5, "moments"), rel=1e-12) for r in (1, 2)]


@pytest.mark.parametrize("federation,opts,expected", [
    ({"sampling": "poisson"}, {}, "poisson"),
    ({"clients_per_round": 60}, {}, "none"),  # every client every round: nothing sampled
    ({}, {"noise": "local", "secure_aggregation": False}, "none"),  # local noise: no amplification
])
def test_other_selections_account_what_they_do(federation, opts, expected):
    sim = Run(_cfg(federation=federation, **opts), None, log=lambda s: None)
    sim.setup()
    assert sim.epsilon_sampling() == expected and sim.ledger.neighbouring == "add_remove"
    assert "assumed" not in sim.accounting_note()


@pytest.mark.parametrize("scheme,accountant,match", [
    ("fl-std-dp", "pld", "cannot account the fixed-size cohort as sampling without replacement"),
    ("fl-sign-dp", "moments", "state privacy.sampling_assumption = 'poisson'"),
])
def test_an_accounting_that_cannot_do_without_replacement_is_an_error(scheme, accountant, match):
    with pytest.raises(ConfigError, match=match):
        Run(_cfg(scheme, accountant=accountant), None, log=lambda s: None)


def test_poisson_federation_cannot_claim_sampling_without_replacement():
    with pytest.raises(ConfigError, match="draws each client independently"):
        _cfg(federation={"sampling": "poisson"}, privacy={"sampling_assumption": "without-replacement"})


def test_epsilon_option_calibrates_sigma_for_sampling_without_replacement():
    def sigma(**kw):
        return Run(_cfg(sigma=None, epsilon=8.0, **kw), None, log=lambda s: None).scheme.steps[-1].sigma

    s = sigma()
    assert epsilon_without_replacement(s, 60, 6, 2, 1e-5, "moments") <= 8.0
    assert epsilon_without_replacement(s * (1 - 1e-4), 60, 6, 2, 1e-5, "moments") > 8.0
    assert s > sigma(privacy={"sampling_assumption": "poisson"})
