"""Accounting comparison (J&E): σ calibration per method vs closed forms and each theorem,
the Yeom advantage, learning vs the non-private baseline, and the one-command CLI."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli.accounting import app
from dpfl.experiments.accounting_comparison import (
    METHODS,
    Config,
    achieved_epsilon,
    evaluate,
    load_data,
    noise_multiplier,
    train,
    yeom_advantage,
)
from dpfl.rng import Seeds

E, N, B, DELTA = 100, 10_000, 200, 1e-5


def test_zcdp_sigma_is_jayaraman_evans_closed_form():
    L = math.log(1 / DELTA)
    for eps in (0.1, 1.0, 10.0, 1000.0):
        je = math.sqrt(E / 2) * (math.sqrt(L + eps) + math.sqrt(L)) / eps
        assert noise_multiplier("zcdp", eps, DELTA, E, N, B) == pytest.approx(je, rel=1e-12)


def test_nc_is_no_noisier_than_the_classic_formula_where_that_is_valid():
    for eps in (0.1, 1.0, 10.0, 50.0):  # per-epoch ε/E < 1: the classic Gaussian theorem applies
        classic = E * math.sqrt(2 * math.log(1.25 * E / DELTA)) / eps
        assert noise_multiplier("nc", eps, DELTA, E, N, B) <= classic


@pytest.mark.parametrize("method", [m for m in METHODS if m != "pld"])
def test_each_method_certifies_its_target(method):
    for eps in (0.5, 20.0):
        s = noise_multiplier(method, eps, DELTA, E, N, B)
        got = achieved_epsilon(method, s, DELTA, E, N, B)
        assert got <= eps * (1 + 1e-6) and got == pytest.approx(eps, rel=1e-3)


def test_tighter_accounting_needs_less_noise():
    s = {m: noise_multiplier(m, 1.0, DELTA, E, N, B) for m in ("nc", "ac", "zcdp", "rdp")}
    assert s["nc"] > s["ac"] > s["zcdp"] > s["rdp"]


def test_yeom_advantage():
    low, high = torch.linspace(0, 1, 100), torch.linspace(2, 3, 100)
    assert yeom_advantage(low, high) == pytest.approx(0.5)  # half the members lie below their mean
    same = torch.rand(10_000, generator=torch.Generator().manual_seed(0))
    assert abs(yeom_advantage(same[:5000], same[5000:])) < 0.03


@pytest.mark.fashion_mnist
def test_dp_training_learns_at_large_epsilon_and_not_at_small():
    cfg = Config(n_train=400, n_test=400, epochs=2, batch_size=100, models=("lr",))
    xtr, ytr, xte, yte, k = load_data(cfg, 0)

    def acc(sigma, sampling="poisson"):
        return evaluate(train("lr", xtr, ytr, k, cfg, sigma, sampling, Seeds(1)), xtr, ytr, xte, yte)["test_acc"]

    base = acc(None, "shuffle")
    s_hi = noise_multiplier("rdp", 1000.0, DELTA, cfg.epochs, cfg.n_train, cfg.batch_size)
    s_lo = noise_multiplier("rdp", 0.1, DELTA, cfg.epochs, cfg.n_train, cfg.batch_size)
    assert base > 0.6
    assert acc(s_hi) > base - 0.1
    assert acc(s_lo) < acc(s_hi) - 0.2


@pytest.mark.fashion_mnist
def test_cli_writes_plot_and_numbers(tmp_path):
    res = CliRunner().invoke(app, ["--out-dir", str(tmp_path), "--n-train", "100", "--n-test", "100",
                                   "--epochs", "1", "--batch-size", "50", "--epsilons", "10",
                                   "--methods", "nc,rdp", "--models", "lr"])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "accounting_comparison.json").read_text())
    assert (tmp_path / "accounting_comparison.png").stat().st_size > 10_000
    runs = {(r["method"], r["epsilon"]): r for r in out["runs"]}
    base = runs[("none", None)]["test_acc"]
    for m in ("nc", "rdp"):
        r = runs[(m, 10.0)]
        assert r["accuracy_loss"] == pytest.approx(1 - r["test_acc"] / base)
        assert out["achieved_epsilon"][m]["10.0"] <= 10.0 * (1 + 1e-6)
    bad = CliRunner().invoke(app, ["--out-dir", str(tmp_path), "--methods", "magic"])
    assert bad.exit_code == 2 and "magic" in bad.output
