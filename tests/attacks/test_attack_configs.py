"""The chapter-6 row configs: valid, complete, and in the thesis's settings."""

import json

import numpy as np
import pytest

from dpfl.attacks.registry import build_attack
from dpfl.config import load_config
from dpfl.experiments.reproduce import configs_root

TABLES = ["table-6.1", "table-6.1-fmnist", "table-6.3", "table-6.3-fmnist", "table-6.9", "table-6.10",
          "table-6.11", "table-6.12"]
ROWS = [(t, p) for t in TABLES for p in sorted((configs_root() / t).glob("*.toml"))]


def test_every_table_has_rows_and_thesis_numbers_for_exactly_those_rows():
    for t in TABLES:
        thesis = json.loads((configs_root() / t / "thesis.json").read_text())
        rows = {p.stem for p in (configs_root() / t).glob("*.toml")}
        assert set(thesis) - {"_table"} == rows and thesis["_table"]["description"]
    assert len(ROWS) == 11 + 11 + 9 + 9 + 12 + 12 + 16 + 12


@pytest.mark.parametrize("table,path", ROWS, ids=[f"{t}/{p.stem}" for t, p in ROWS])
def test_row_config_matches_the_thesis_setting(table, path):
    cfg = load_config(path)
    thesis = json.loads((configs_root() / table / "thesis.json").read_text())[path.stem]
    assert cfg.data.dataset == ("fashion-mnist" if table in ("table-6.1-fmnist", "table-6.3-fmnist", "table-6.10",
                                                             "table-6.12") else "mnist")
    assert cfg.model.name == "cnn" and cfg.train.batch_size == 10 and cfg.train.lr == 0.215
    a = cfg.attack
    if table in TABLES[:4]:  # setting A: N = 1000, C = 0.1, T_gd = 30, T_cl = 100
        assert (cfg.data.n_clients, cfg.cohort_size(), cfg.train.steps, cfg.federation.rounds) == (1000, 100, 30, 100)
        assert cfg.scheme.name in ("fl-std", "fl-sign")
        if a is not None:
            assert a.name == ("random-update" if table in TABLES[:2] else "gradient-ascent")
            assert a.options.get("sigma", 200.0) == 200.0
            assert a.options.get("boost", 1.0) == (10.0 if cfg.scheme.name == "fl-std" and "6.3" in table else 1.0)
            assert (thesis["accuracy"] is None) == (cfg.scheme.name == "fl-std" or a.fraction == 0.6)
    else:  # setting B (Table 8.2) with γ = 0.001
        assert (cfg.data.n_clients, cfg.cohort_size(), cfg.train.steps, cfg.federation.rounds) == (6000, 100, 5, 200)
        assert cfg.scheme.options["gamma"] == 0.001
        assert a.name == ("in-backdoor" if table in ("table-6.9", "table-6.10") else "out-backdoor")
        src, tgt = {"table-6.9": (5, 7), "table-6.10": (5, 7), "table-6.11": (0, 1), "table-6.12": (0, 1)}[table]
        assert (a.options["source"], a.options["target"]) == (src, tgt)
        dp = cfg.scheme.name == "fl-sign-dp"
        assert a.options.get("omit_noise", False) == dp and a.options.get("sign_boost") == (5000.0 if dp else None)
        if dp:
            assert cfg.scheme.options["epsilon"] == thesis["epsilon"] and cfg.privacy.accountant == "moments"
        metric = "source_accuracy" if a.name == "in-backdoor" else "attack_success"
        assert 0 <= thesis[metric] <= 1 and 0 < thesis["accuracy"] <= 1
    if a is not None:
        assert str(round(a.fraction * 100)).zfill(2) == path.stem.rsplit("-", 1)[1]
        build_attack(a)


@pytest.mark.parametrize("eps,sigma", [(1.0, 1.5406), (2.0, 1.0844), (4.0, 0.8100)])
def test_fl_sign_dp_rows_calibrate_to_the_thesis_sigma(eps, sigma):
    from dpfl.schemes.registry import build_scheme, list_schemes

    if "fl-sign-dp" not in list_schemes():
        pytest.skip("fl-sign-dp is not registered in this checkout")
    cfg = load_config(configs_root() / "table-6.12" / f"fl-sign-dp-eps{int(eps)}-10.toml")
    env = {"n_params": 1_663_370, "cohort_size": cfg.cohort_size(), "n_clients": cfg.data.n_clients,
           "train": cfg.train, "privacy": cfg.privacy, "seed": cfg.seed, "sampling_rate": cfg.sampling_rate(),
           "rounds": cfg.federation.rounds, "dropout": 0.0}
    share = build_scheme(cfg.scheme.name, dict(cfg.scheme.options), env).steps[1]
    assert share.sigma == pytest.approx(sigma, abs=1e-4)


def test_out_backdoor_leaves_every_fashion_mnist_client_some_data():
    from dpfl.data import load_dataset, partition
    from dpfl.errors import DataError
    from dpfl.rng import Seeds

    cfg = load_config(configs_root() / "table-6.12" / "fl-sign-10.toml")
    try:
        y = load_dataset("fashion-mnist").y_train.numpy()
    except DataError:
        pytest.skip("Fashion-MNIST IDX files not installed")
    clients = partition(y, cfg.data.n_clients, "shards", seed=Seeds(cfg.seed).seed("partition"))
    left = np.array([(y[c] != 0).sum() for c in clients])
    assert left.min() >= 1 and abs(left.mean() - 9.0) < 0.05  # T-shirts are 1/10 of the data
