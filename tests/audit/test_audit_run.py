"""`dpfl audit` runs for every client-level DP scheme, writes audit.json, and `dpfl report` shows it; a config
it cannot audit is one clear error line."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpfl.audit.run import audit
from dpfl.cli.main import app
from dpfl.errors import ConfigError

SCHEMES = [("fl-std-dp", {}, {}), ("fl-sign-dp", {}, {"privacy.accountant": "rdp"}), ("fl-cs-dp", {}, {}),
           ("fl-rnd-dp", {}, {}), ("fl-freq-dp", {}, {}), ("fl-top-dp", {}, {"data.public_size": 100}),
           ("fl-basic-dp", {}, {}), ("qsgd-dp", {}, {}), ("fl-std-dp", {"noise": "central"}, {})]


@pytest.mark.parametrize("name,opts,extra", SCHEMES, ids=[s[0] + ("-" + s[1]["noise"] if s[1] else "")
                                                           for s in SCHEMES])
def test_every_dp_scheme_is_audited(audit_config, name, opts, extra, tmp_path):
    clip = {} if name in ("fl-sign-dp",) else {"clip": 1.0}
    cfg = audit_config(**{"scheme.name": name, "scheme.options": {"epsilon": 2.0, **clip, **opts},
                          "federation.rounds": 2, **extra})
    out = audit(cfg, canaries=60, out_dir=tmp_path, log=lambda s: None)
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["scheme"] == name and saved["canaries"] == 60 and saved["level"] == "client"
    assert saved["epsilon_accounted"] == pytest.approx(out["epsilon_accounted"])
    for box in ("white", "black"):
        assert 0 <= saved[box]["epsilon_lower_bound"] < saved["epsilon_accounted"]
        assert saved[box]["correct"] <= saved[box]["guesses"]


def test_black_box_scores_only_the_final_model(audit_config, tmp_path):
    out = audit(audit_config(**{"federation.rounds": 1}), canaries=40, observe="black", log=lambda s: None)
    assert "black" in out and "white" not in out


@pytest.mark.parametrize("over,msg", [
    ({"scheme.name": "fl-std", "scheme.options": {}}, "nothing to audit"),
    ({"federation.fraction": None, "federation.clients_per_round": 5}, "federation.sampling = 'poisson'"),
    ({"attack": {"name": "random-update", "fraction": 0.2}}, "without an attack"),
])
def test_configs_it_cannot_audit_are_one_line_errors(audit_config, over, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        audit(audit_config(**over), canaries=40, log=lambda s: None)
    assert "\n" not in str(e.value)


def test_cli_writes_audit_json_and_report_shows_it(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('name = "cli-audit"\nseed = 1\n[data]\ndataset = "digits"\nn_clients = 10\npartition = "shards"\n'
                   '[model]\nname = "mlp"\noptions = { in_features = 64, hidden = 16, num_classes = 10 }\n'
                   '[train]\nsteps = 1\nbatch_size = 8\n[federation]\nrounds = 1\nsampling = "poisson"\n'
                   'fraction = 0.5\n[scheme]\nname = "fl-std-dp"\noptions = { epsilon = 4.0, clip = 1.0 }\n'
                   '[eval]\nevery = 10\n[run]\nthreads = 1\n')
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["audit", str(cfg), "--canaries", "40", "--confidence", "0.9", "--observe", "white",
                                 "-o", str(run)])
    assert r.exit_code == 0, r.output
    saved = json.loads((run / "audit.json").read_text())
    assert saved["confidence"] == 0.9 and saved["canaries"] == 40
    assert "lower bound" in r.output and "accounted" in r.output
    r = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    assert "privacy audit of" in r.output and f"{saved['white']['epsilon_lower_bound']:.3f}" in r.output
    r = CliRunner().invoke(app, ["audit", str(cfg), "--canaries", "40", "--observe", "grey", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--observe must be 'white' or 'black'" in r.output


def test_record_level_dpsgd_in_clients_is_audited(audit_config, tmp_path):
    cfg = audit_config(**{"scheme.name": "fl-std", "scheme.options": {}, "data.n_clients": 4,
                          "train.dpsgd": {"noise_multiplier": 1.0, "clip": 1.0}, "federation.rounds": 2})
    out = audit(cfg, canaries=100, out_dir=tmp_path, log=lambda s: None)
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["level"] == "record" and saved["released_rounds"] == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert saved["epsilon_accounted"] == pytest.approx(summary["record_level"]["epsilon_max"])
    assert saved == json.loads(json.dumps(out))
    for box in ("white", "black"):
        assert 0 <= saved[box]["epsilon_lower_bound"] < saved["epsilon_accounted"]


def test_record_canaries_are_in_the_clients_data_only_when_included(audit_config):
    from dpfl.audit.records import RecordCanaryRun

    cfg = audit_config(**{"scheme.name": "fl-std", "scheme.options": {}, "data.n_clients": 4,
                          "train.dpsgd": {"noise_multiplier": 1.0, "clip": 1.0}, "federation.rounds": 1})
    sim = RecordCanaryRun(cfg, 50, log=lambda s: None)
    real = sim.fed.x.shape[0] - int(sim.included.sum())
    held = np.sort(np.concatenate(sim.fed.clients))
    assert held[held >= real].tolist() == list(range(real, sim.fed.x.shape[0]))  # each included canary once
    assert torch.equal(sim.fed.x[real:], sim.canary_x[torch.from_numpy(sim.included)])
    assert torch.equal(sim.fed.y[real:], sim.canary_y[torch.from_numpy(sim.included)])
    with pytest.raises(ConfigError, match="--scale"):
        audit(cfg, canaries=100, scale=3.0, log=lambda s: None)


def test_report_shows_an_audit_record_without_training_metrics(tmp_path):
    """A central DP-SGD audit (or a committed audit record) has audit.json but no metrics.jsonl:
    `dpfl report` prints the audit alone, beside a training run when given both."""
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "docs" / "audit" / "central-dpsgd-eps4"
    rec = tmp_path / "central"
    shutil.copytree(src, rec)
    saved = json.loads((rec / "audit.json").read_text())
    r = CliRunner().invoke(app, ["report", str(rec)])
    assert r.exit_code == 0, r.output
    assert "privacy audit of central" in r.output and f"{saved['white']['epsilon_lower_bound']:.3f}" in r.output
    r = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert r.exit_code != 0 and "not a run directory" in r.output
