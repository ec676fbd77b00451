"""Central DP-SGD (`dpfl dpsgd`) is audited through the real `dpfl.dpsgd.train`: gradient canaries leave the
real per-example clipping at C·e_j, the honest run's bounds stay below the accounted ε, noise at σ/4 is
caught, and a config the audit cannot take is one error line."""

import importlib
import json

import pytest
import torch
from typer.testing import CliRunner

from dpfl.audit.central import CentralConfig, GradientCanaryModel, load_central_config
from dpfl.audit.run import audit
from dpfl.cli.main import app
from dpfl.dpsgd.central import DPSGDConfig
from dpfl.errors import ConfigError

train_module = importlib.import_module("dpfl.dpsgd.train")  # `dpfl.dpsgd.train` the attribute is the function


def tiny(**over) -> CentralConfig:
    """Digits (1,437 training records), an MLP of 1,210 parameters, every record in every step (q = 1),
    3 steps, σ calibrated to ε = 2 at δ = 1e-5 (PLD)."""
    kw = {"dataset": "digits", "model": "mlp", "model_options": {"in_features": 64, "hidden": 16, "num_classes": 10},
          "epochs": 3.0, "lot_size": 1437, "target_epsilon": 2.0, "accountant": "pld", "lr": 0.5, "seed": 3,
          **over}
    return CentralConfig("central-tiny", DPSGDConfig(**kw), threads=1)


def _run(tmp_path, canaries=1000, **over):
    return audit(tiny(**over), canaries=canaries, confidence=0.95, observe="white", out_dir=tmp_path,
                 log=lambda s: None)


def test_gradient_canaries_leave_the_real_clip_at_c_times_their_own_coordinate():
    from dpfl.dpsgd.core import _CLIP_MARGIN, clip_factors, per_example_grads
    from dpfl.models import build_model

    base = build_model("mlp", seed=0, in_features=64, hidden=16, num_classes=10)
    model = GradientCanaryModel(base, 5, (1, 8, 8), 10, clip=0.7)
    x = torch.rand(4, 65)
    x[:, -1] = torch.tensor([0.0, 3.0, 0.0, 5.0])  # rows 1 and 3: canaries 2 and 4
    x[[1, 3], :-1] = 0
    y = torch.tensor([2, 1, 7, 1])
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = per_example_grads(params, {}, model, x, y)
    for row, j in ((1, 2), (3, 4)):
        expect = torch.zeros(5)
        expect[j] = 10 * 0.7
        assert torch.allclose(g["canary"][row], expect, rtol=1e-5)
        assert all(float(v[row].abs().max()) == 0 for k, v in g.items() if k != "canary")
    for row in (0, 2):  # a real record: the plain model's gradient, nothing on the canary coordinates
        assert float(g["canary"][row].abs().max()) == 0
        plain = per_example_grads({k[5:]: v for k, v in params.items() if k != "canary"}, {}, base,
                                  x[row:row + 1, :-1].reshape(1, 1, 8, 8), y[row:row + 1])
        assert torch.allclose(g["base.net.1.weight"][row], plain["net.1.weight"][0], atol=1e-6)
    w = clip_factors(g, 0.7)
    assert float(w[1] * 10 * 0.7) == pytest.approx(0.7 * _CLIP_MARGIN, rel=1e-6)


def test_central_dpsgd_is_audited_and_the_honest_run_is_not_flagged(tmp_path):
    out = _run(tmp_path)
    saved = json.loads((tmp_path / "audit.json").read_text())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(out))
    assert saved["level"] == "central" and saved["canaries"] == 1000
    assert saved["epsilon_accounted"] == pytest.approx(2.0, abs=1e-3) == summary["epsilon"]
    assert summary["steps"] == 3 and summary["sample_rate"] == 1.0
    assert 0 < saved["included"] < 1000 and 0 < saved["included_inputs"] < 1000
    for box in ("white", "black"):
        assert 0 <= saved[box]["epsilon_lower_bound"] < saved["epsilon_accounted"]
    assert not saved["flagged"]
    assert load_central_config(tmp_path / "config.toml") == tiny()  # the record rebuilds the run


def test_central_noise_at_a_quarter_of_sigma_is_caught(tmp_path, monkeypatch):
    honest = train_module.noisy_gradient

    def quarter(grad_sum, **kw):
        return honest(grad_sum, **{**kw, "noise_multiplier": kw["noise_multiplier"] / 4})

    monkeypatch.setattr(train_module, "noisy_gradient", quarter)
    out = _run(tmp_path)
    assert out["epsilon_accounted"] == pytest.approx(2.0, abs=1e-3)  # the ledger still says σ
    assert out["white"]["epsilon_lower_bound"] > out["epsilon_accounted"]
    assert out["flagged"]


def test_black_box_trains_the_plain_model(tmp_path):
    out = audit(tiny(), canaries=40, observe="black", out_dir=tmp_path, log=lambda s: None)
    assert "black" in out and "white" not in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clipping_path"] == "book-keeping"  # as `dpfl dpsgd train` trains this model


def test_cli_audits_a_central_config_file(tmp_path):
    cfg = tmp_path / "central.toml"
    cfg.write_text('name = "cli-central"\nthreads = 1\n[dpsgd]\ndataset = "digits"\nmodel = "mlp"\n'
                   'model_options = { in_features = 64, hidden = 8, num_classes = 10 }\nepochs = 1.0\n'
                   'lot_size = 700\nnoise_multiplier = 2.0\n')
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["audit", str(cfg), "--canaries", "40", "--set", "dpsgd.lr=0.3", "-o", str(run)])
    assert r.exit_code == 0, r.output
    saved = json.loads((run / "audit.json").read_text())
    assert saved["level"] == "central" and saved["name"] == "cli-central"
    assert load_central_config(run / "config.toml").dpsgd.lr == 0.3
    assert "lower bound" in r.output and "accounted" in r.output


@pytest.mark.parametrize("text,args,msg", [
    ('name = "x"\n[dpsgd]\nnoise_multiplier = 1.0\n[federation]\nrounds = 2\n', [], "federation do not apply"),
    ('[dpsgd]\nnoise_multiplier = 1.0\nrounds = 2\n', [], "dpsgd.rounds: Extra inputs"),
    ('[dpsgd]\nepochs = 1.0\n', [], "exactly one of noise_multiplier and target_epsilon"),
    ('threads = 0\n[dpsgd]\nnoise_multiplier = 1.0\n', [], "threads must be an integer"),
    ('[dpsgd]\ndataset = "digits"\nnoise_multiplier = 1.0\n', ["--level", "record"], "no record-level DP"),
    ('[dpsgd]\ndataset = "digits"\nnoise_multiplier = 1.0\n', ["--scale", "3"], "--scale"),
])
def test_what_a_central_audit_cannot_take_is_one_error_line(tmp_path, text, args, msg):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    r = CliRunner().invoke(app, ["audit", str(cfg), "--canaries", "20", "-o", str(tmp_path / "r"), *args])
    assert r.exit_code == 2, r.output
    assert msg in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error")]) == 1


def test_level_central_needs_a_central_config(audit_config):
    with pytest.raises(ConfigError, match="--level central audits a central DP-SGD config"):
        audit(audit_config(), canaries=20, level="central", log=lambda s: None)
