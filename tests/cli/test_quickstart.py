"""`dpfl quickstart`: both runs, what each reached, ε for the private one, and what to try next;
`dpfl reproduce list` marks the tables that need files the user supplies."""

from pathlib import Path

from typer.testing import CliRunner

import dpfl.cli.main as cli
from dpfl.config import dump_config, load_config
from dpfl.experiments.reproduce import configs_root, list_tables

# the built-in configs, shrunk: digits at 8x8, a few clients and rounds
TINY = ["data.dataset=digits", "model.options.in_features=64", "federation.rounds=2", "eval.every=1"]


def test_quickstart_runs_fl_std_then_fl_std_dp_and_prints_epsilon(tmp_path, monkeypatch):
    def tiny(name: Path) -> Path:
        extra = ["data.n_clients=30", "federation.fraction=0.5"] if name.name == "quickstart-dp" else \
            ["data.n_clients=10", "federation.clients_per_round=5"]
        path = tmp_path / f"{name.name}.toml"
        path.write_text(dump_config(load_config(configs_root() / f"{name.name}.toml", TINY + extra)))
        return path

    monkeypatch.setattr(cli, "_resolve_config", tiny)
    r = CliRunner().invoke(cli.app, ["quickstart", "--out", str(tmp_path / "runs")], terminal_width=200)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    plain = next(x for x in lines if x.startswith("quickstart ") and " accuracy " in x)
    private = next(x for x in lines if x.startswith("quickstart-dp ") and " accuracy " in x)
    assert "ε" not in plain
    assert "ε = " in private and "Poisson" in private
    assert any(x.startswith("next: `dpfl report ") for x in lines)
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_builtin_quickstart_configs_load_and_the_dp_one_is_private():
    plain = load_config(configs_root() / "quickstart.toml")
    private = load_config(configs_root() / "quickstart-dp.toml")
    assert plain.data.dataset == private.data.dataset == "default"
    assert plain.scheme.name == "fl-std" and private.scheme.name == "fl-std-dp"
    assert private.federation.sampling == "poisson" and private.privacy.accountant == "pld"


def test_reproduce_list_marks_tables_that_need_user_files():
    tables = list_tables()
    assert "NEEDS the mnist files" in tables["table-6.1"]
    assert "NEEDS" not in tables["table-4.4"] and "NEEDS" not in tables["table-6.1-fmnist"]
