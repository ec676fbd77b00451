"""Noise samplers, noisy-max aggregators and the `pate analyze` command."""

import json

import numpy as np
import pytest
from pate_reference import gauss, laplace, noisy_max_probs
from scipy import stats
from typer.testing import CliRunner

from dpfl.cli.pate import app
from dpfl.errors import DpflError
from dpfl.pate import noisy_max
from dpfl.pate.noise import gaussian as gauss_noise
from dpfl.pate.noise import laplace as lap_noise
from dpfl.rng import Seeds


def test_samplers_match_their_distributions():
    rng = Seeds(0).crypto("samplers")
    x = lap_noise(rng, 20000, 2.5)
    assert stats.kstest(x, stats.laplace(scale=2.5).cdf).pvalue > 1e-3
    z = gauss_noise(rng, 20001, 0.7)
    assert z.shape == (20001,) and stats.kstest(z, stats.norm(scale=0.7).cdf).pvalue > 1e-3
    with pytest.raises(DpflError):
        lap_noise(rng, 3, 0.0)
    a, b = lap_noise(Seeds(1).crypto("s"), 5, 1.0), lap_noise(Seeds(1).crypto("s"), 5, 1.0)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("mechanism, noise, dist", [("lnmax", 0.5, laplace(0.5)), ("gnmax", 1.5, gauss(1.5))])
def test_noisy_max_output_distribution(mechanism, noise, dist):
    counts = np.array([5.0, 4.0, 2.0])
    exact = noisy_max_probs(counts, dist)
    n = 40000
    out = noisy_max(np.tile(counts, (n, 1)), mechanism, noise, Seeds(2).crypto(mechanism))
    observed = np.bincount(out, minlength=3)
    assert stats.chisquare(observed, exact * n).pvalue > 1e-3


def test_noisy_max_rejects_bad_noise():
    with pytest.raises(DpflError, match="must be > 0"):
        noisy_max(np.ones((2, 3)), "lnmax", -1.0, Seeds(0).crypto("x"))
    with pytest.raises(DpflError, match="mechanism"):
        noisy_max(np.ones((2, 3)), "max", 1.0, Seeds(0).crypto("x"))


def test_cli_analyze(tmp_path):
    rng = np.random.default_rng(0)
    preds = np.where(rng.random((50, 40)) < 0.9, 3, rng.integers(0, 10, (50, 40)))
    path = tmp_path / "votes.npz"
    np.savez(path, teacher_preds=preds, indices=np.arange(20), labels=np.full(20, 3))
    res = CliRunner().invoke(app, ["analyze", str(path), "--noise", "0.05", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["queries"] == 20 and rep["teachers"] == 50 and rep["label_agreement"] == 1.0
    # 20 queries at γ = 0.05: min_l (20·min(2γ²l(l+1), 2γl) + ln 1e5)/l
    closed = min((20 * min(0.005 * l * (l + 1), 0.1 * l) + np.log(1e5)) / l for l in range(1, 9))
    assert rep["eps_data_independent"] == pytest.approx(closed, rel=1e-12)
    csv = tmp_path / "preds.csv"
    np.savetxt(csv, preds, delimiter=",", fmt="%d")
    assert CliRunner().invoke(app, ["analyze", str(csv)]).exit_code == 2  # ambiguous without --kind
    res2 = CliRunner().invoke(app, ["analyze", str(csv), "--kind", "preds", "--seed", "1", "--json"])
    assert json.loads(res2.stdout)["queries"] == 40
