"""FedCollabNN Alg. 2, its baselines, evaluation, and tiny end-to-end runs of both commands."""

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from dpfl.cli.collab import app
from dpfl.collab.fedcollab import Worker, evaluate, train_fedavg, train_losses
from dpfl.errors import DpflError
from dpfl.rng import Seeds


def make(k=3, hetero=False, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(k):
        torch.manual_seed(100 + i)
        m = (
            nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
            if hetero and i % 2
            else nn.Sequential(nn.Flatten(), nn.Linear(6, 3))
        )
        x = torch.randn(n, 6, generator=g)
        out.append(Worker(m, x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()))
    return out


def clone(ws):
    return [Worker(copy.deepcopy(w.model), w.x, w.y) for w in ws]


def vec(m):
    return torch.cat([p.detach().ravel() for p in m.parameters()])


@pytest.mark.parametrize("mode", ["sum", "average"])
def test_loss_aggregation_is_the_plain_sum_and_gives_local_gradients(mode):
    ws = make(3, hetero=True)
    ref = clone(ws)
    lr, k = 0.3, 3
    log = train_losses(
        ws, combine=mode, epochs=1, batch_size=24, lr=lr, seeds=Seeds(0)
    )  # one full-batch step
    assert log.opened_values == 1 and log.max_open_error <= 3 * 2.0**-25
    assert (log.traffic.peer_messages, log.broadcast_bytes) == (6, 24)
    w = 1.0 if mode == "sum" else 1.0 / k
    losses = [F.cross_entropy(r.model(r.x), r.y) for r in ref]
    agg = sum(losses) * w
    agg.backward()  # by hand: the gradient of the aggregate on each model
    for r, got in zip(ref, ws):
        expect = torch.cat([(p - lr * p.grad).detach().ravel() for p in r.model.parameters()])
        assert torch.allclose(vec(got.model), expect, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "average"])
def test_alg2_equals_independent_training_at_lr_times_weight(mode):
    """Reference note B1.5, checked on the implementation (K = 3: 1/K is not a power of two)."""
    ws = make(3, hetero=True, n=40)
    a = train_losses(clone(ws), combine=mode, epochs=3, batch_size=8, lr=0.2, seeds=Seeds(5))
    b = train_losses(
        clone(ws),
        combine="independent",
        epochs=3,
        batch_size=8,
        lr=0.2 * (1.0 if mode == "sum" else 1 / 3),
        seeds=Seeds(5),
    )
    for pa, pb, w0 in zip(a.final_params, b.final_params, ws):
        assert torch.allclose(pa, pb, atol=1e-6)
        assert not torch.allclose(pa, vec(w0.model), atol=1e-3)  # training moved the model


def test_fedavg_averages_through_secret_sharing():
    ws = make(3)
    ref = clone(ws)
    log = train_fedavg(ws, epochs=1, batch_size=24, lr=0.5, seeds=Seeds(0), sync_every=1)
    theta0 = vec(ref[0].model)
    locals_ = []
    for r in ref:  # each worker: one step from the global θ0 on its own data
        torch.nn.utils.vector_to_parameters(theta0.clone(), r.model.parameters())
        r.model.zero_grad()
        F.cross_entropy(r.model(r.x), r.y).backward()
        locals_.append(torch.cat([(p - 0.5 * p.grad).detach().ravel() for p in r.model.parameters()]))
    expect = torch.stack(locals_).mean(0)
    assert torch.allclose(log.final_params[0], expect, atol=1e-6)
    assert all(torch.equal(vec(w.model), log.final_params[0]) for w in ws)
    n = expect.numel()
    assert log.traffic.peer_bytes == 6 * n * 8 and log.broadcast_bytes == 3 * n * 4
    with pytest.raises(DpflError, match="same architecture"):
        train_fedavg(make(3, hetero=True), epochs=1, batch_size=8, lr=0.1, seeds=Seeds(0))


def test_evaluate_ensemble_rules():
    ws = make(3)
    x, y = ws[0].x, ws[0].y
    r = evaluate([w.model for w in ws], x, y, vote_gamma=0.05, rng_seeds=Seeds(0), tag=("t",))
    preds = torch.stack([w.model(x).argmax(1) for w in ws])
    assert r["worker_accuracy"] == pytest.approx([float((p == y).double().mean()) for p in preds], abs=1e-12)
    plural = torch.tensor([np.bincount(preds[:, i].numpy(), minlength=3).argmax() for i in range(len(y))])
    assert r["vote_accuracy"] == pytest.approx(float((plural == y).double().mean()), abs=1e-12)
    soft = torch.stack([w.model(x).softmax(1) for w in ws]).mean(0).argmax(1)
    assert r["softmax_accuracy"] == pytest.approx(float((soft == y).float().mean()))
    assert 0 <= r["noisy_vote_accuracy"] <= 1


TINY = """
seed = 1
out = "{out}"
[data]
dataset = "digits"
n_train = 360
n_test = 160
[collab]
workers = [3, 4]
models = ["logreg", {{name = "mlp", options = {{in_features = 64, hidden = [16]}}}}]
model_options = {{in_features = 64}}
epochs = 1
batch_size = 16
lr = 0.5
algorithms = ["fedcollab", "independent"]
[generate]
workers = 3
n_public = 60
noise = 0.5
out_dir = "{gen}"
student_model = "logreg"
student_options = {{in_features = 64}}
student_epochs = 2
"""


def test_tiny_end_to_end_run_and_generate(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY.format(out=tmp_path / "res.json", gen=tmp_path / "gen"))
    r = CliRunner().invoke(app, ["run", str(cfg)])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "res.json").read_text())
    assert [run["workers"] for run in res["runs"]] == [3, 4]
    for run in res["runs"]:
        assert (
            len(run["fedcollab"]["history"]) == 1
            and len(run["fedcollab"]["history"][-1]["worker_accuracy"]) == run["workers"]
        )
        assert run["max_param_diff_fedcollab_vs_independent"] < 1e-5 * max(1.0, run["param_scale"])
        assert run["independent"]["lr"] == pytest.approx(0.5 / run["workers"])
    g = CliRunner().invoke(app, ["generate", str(cfg)])
    assert g.exit_code == 0, g.output
    rep = json.loads((tmp_path / "gen" / "privacy_report.json").read_text())
    z = np.load(tmp_path / "gen" / "dataset.npz")
    assert z["x"].shape == (60, 1, 8, 8) and z["y"].shape == (60,) and set(z["y"]) <= set(range(10))
    rows = (tmp_path / "gen" / "dataset.csv").read_text().splitlines()
    assert len(rows) == 61 and rows[0].startswith("index,label,x0") and len(rows[1].split(",")) == 66
    assert [int(v) for v in rows[1].split(",")[:2]] == [int(z["index"][0]), int(z["y"][0])]
    p = rep["privacy"]
    closed = min((60 * min(2 * 0.25 * l * (l + 1), 2 * 0.5 * l) + np.log(1e5)) / l for l in range(1, 9))
    assert p["eps_data_independent"] == pytest.approx(closed, rel=1e-12) and p["queries"] == 60
    assert p["eps_data_dependent"] <= p["eps_data_independent"] and p["teachers"] == 3
    assert 0 <= rep["student_test_accuracy"] <= 1 and rep["student_eval_examples"] == 100
    first = z["y"].copy()
    assert CliRunner().invoke(app, ["generate", str(cfg), "--out-dir", str(tmp_path / "gen2")]).exit_code == 0
    assert np.array_equal(np.load(tmp_path / "gen2" / "dataset.npz")["y"], first)  # same seed, same labels


def test_bad_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[collab]\nmode = 'median'\n")
    r = CliRunner().invoke(app, ["run", str(cfg)])
    assert r.exit_code == 2 and "mode" in r.output
    assert CliRunner().invoke(app, ["run", str(tmp_path / "missing.toml")]).exit_code == 2


def test_shipped_configs_validate():
    from pathlib import Path

    from dpfl.collab.config import load_config

    root = Path(__file__).resolve().parents[2] / "dpfl" / "collab" / "configs"
    sweep = load_config(root / "fedcollab-fmnist.toml")
    assert sweep.collab.workers == [10, 12, 14, 16, 18, 20] and sweep.collab.epochs == 5
    assert (sweep.data.n_train, sweep.data.n_test) == (32000, 10000)
    gen = load_config(root / "generate-fmnist.toml")
    assert gen.generate is not None and gen.generate.n_public < gen.data.n_test


def test_generate_with_confident_gnmax(tmp_path):
    """Only the answered queries become data; the report charges step 2 on those only."""
    from dpfl.pate.gnmax import default_orders

    cfg = tmp_path / "tiny.toml"
    text = TINY.format(out=tmp_path / "res.json", gen=tmp_path / "gen")
    text = text.replace(
        "noise = 0.5", 'mechanism = "confident-gnmax"\nnoise = 0.5\nthreshold = 3.0\nsigma1 = 1.0'
    )
    cfg.write_text(text)
    g = CliRunner().invoke(app, ["generate", str(cfg)])
    assert g.exit_code == 0, g.output
    rep = json.loads((tmp_path / "gen" / "privacy_report.json").read_text())
    z = np.load(tmp_path / "gen" / "dataset.npz")
    p = rep["privacy"]
    assert p["mechanism"] == "confident-gnmax" and 0 < rep["answered"] < 60
    assert p["answered"] == rep["answered"] == len(z["y"]) == len(z["index"]) and z["y"].min() >= 0
    a = default_orders()  # 60 checks at σ1 = 1 (α/2 each), answered argmaxes at σ2 = 0.5 (α/0.25 each)
    closed = np.min(60 * a / 2 + rep["answered"] * a / 0.25 + np.log(1e5) / (a - 1))
    assert p["eps_data_independent"] == pytest.approx(closed, rel=1e-12)
    assert (
        p["eps_data_dependent"] <= p["eps_data_independent"] and p["eps_data_dependent_released"] is not None
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("sigma1 = 1.0\n", ""))
    r = CliRunner().invoke(app, ["generate", str(bad)])
    assert r.exit_code == 2 and "needs threshold and sigma1" in r.output
