import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from attack_helpers import tiny_config
from sklearn.metrics import roc_curve
from typer.testing import CliRunner

from dpfl.attacks.membership import (
    best_threshold_advantage,
    loss_threshold_attack,
    membership_advantage,
    sample_losses,
)
from dpfl.data import load_dataset
from dpfl.errors import DataError
from dpfl.models import build_model


def test_threshold_attack_matches_brute_force_and_sklearn_roc():
    rng = np.random.default_rng(0)
    a = rng.exponential(0.5, 300)  # members: lower loss
    b = rng.exponential(1.0, 200)
    a[:20] = b[:20]  # ties across the two sets
    res = loss_threshold_attack(a, b)
    tau = a.mean()
    assert res.threshold == tau
    assert res.tpr == sum(x <= tau for x in a) / len(a) and res.fpr == sum(x <= tau for x in b) / len(b)
    assert res.advantage == pytest.approx(res.tpr - res.fpr)
    fpr, tpr, _ = roc_curve(np.r_[np.ones(300), np.zeros(200)], -np.r_[a, b])
    assert res.best_advantage == pytest.approx((tpr - fpr).max())
    assert res.best_advantage >= res.advantage
    assert loss_threshold_attack(a, b, threshold=-1.0).advantage == 0.0
    with pytest.raises(DataError, match="non-finite"):
        loss_threshold_attack(np.array([np.nan]), b)


def test_best_advantage_of_identical_samples_is_zero():
    x = np.random.default_rng(1).normal(size=100)
    assert best_threshold_advantage(x, x.copy()) == 0.0


def digits_fed(n_members=60):
    ds = load_dataset("digits", seed=0)
    return SimpleNamespace(x=ds.x_train, y=ds.y_train, x_test=ds.x_test, y_test=ds.y_test, task="multiclass",
                           clients=[np.arange(0, n_members // 2), np.arange(n_members // 2, n_members)])


def test_overfit_model_leaks_membership_and_untrained_model_does_not():
    fed = digits_fed(60)
    torch.manual_seed(0)
    model = build_model("mlp", seed=0, in_features=64, hidden=64)
    untrained = membership_advantage(model, fed, samples=60, seed=0)
    x, y = fed.x[:60], fed.y[:60]
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):  # memorise 60 samples
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert sample_losses(model, x, y, "multiclass").max() < 0.01
    leaked = membership_advantage(model, fed, samples=60, seed=0)
    assert leaked.advantage > 0.2 and leaked.auc > 0.7  # measured 0.35 and 0.81
    assert abs(untrained.advantage) < 0.15 and abs(untrained.auc - 0.5) < 0.1  # −0.03 and 0.52


def test_membership_from_a_run_directory_and_the_cli(tmp_path):
    from dpfl.cli.attacks import app
    from dpfl.engine.simulator import simulate
    from dpfl.run.state import Run

    out = tmp_path / "run"
    simulate(Run(tiny_config(rounds=2), out, log=lambda s: None))
    res = CliRunner().invoke(app, ["membership", str(out), "--samples", "200", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["members"] == got["non_members"] == 200
    assert got["advantage"] == pytest.approx(got["tpr"] - got["fpr"])
    bad = CliRunner().invoke(app, ["membership", str(tmp_path)])
    assert bad.exit_code == 2 and "not a run directory" in " ".join(bad.output.split())


def test_advantage_standard_error_is_the_binomial_one():
    a, b = np.r_[np.zeros(30), np.ones(70)], np.r_[np.zeros(10), np.ones(40)]
    res = loss_threshold_attack(a, b, threshold=0.5)
    assert (res.tpr, res.fpr) == (0.3, 0.2)
    assert res.advantage_se == pytest.approx(np.sqrt(0.3 * 0.7 / 100 + 0.2 * 0.8 / 50))


def test_leakage_bench_runs_every_scheme_on_a_tiny_federation():
    from dpfl.bench.attacks import run_bench
    from dpfl.schemes.registry import list_schemes

    missing = {"fl-sign", "fl-std-dp", "fl-sign-dp"} - set(list_schemes())
    if missing:
        pytest.skip(f"schemes not registered in this checkout: {sorted(missing)}")
    out = run_bench(dataset="digits", n_train=200, n_test=100, clients=10, per_round=5, rounds=2, samples=100)
    assert list(out) == ["fl-std", "fl-sign", "fl-std-dp", "fl-sign-dp"]
    for name, r in out.items():
        assert r["members"] == r["non_members"] == 100
        assert r["advantage"] == pytest.approx(r["tpr"] - r["fpr"])
        assert (r["epsilon"] is None) == (not name.endswith("-dp"))


def test_list_command_names_every_attack_and_rule():
    from dpfl.attacks.registry import ATTACKS
    from dpfl.cli.attacks import app
    from dpfl.schemes.robust import RULES

    res = CliRunner().invoke(app, ["list"])
    assert res.exit_code == 0
    assert all(name in res.output for name in [*ATTACKS, *RULES])
