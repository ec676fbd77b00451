"""`dpfl data export`: a client's partition, exactly as `dpfl run` splits the configured dataset, written as
site files that `load_site_data` reads back; its share of the test set; bad input is one `error:` line."""

import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli.main import app
from dpfl.config import load_config
from dpfl.data import load_site_data, site_test_split
from dpfl.rng import Seeds
from dpfl.run.state import build_federation

TINY = """name = "tiny"
seed = 3
[data]
dataset = "{dataset}"
options = {options}
n_clients = 5
partition = "dirichlet"
partition_options = {{ alpha = 1.0 }}
[model]
name = "mlp"
options = {{ in_features = {features}, hidden = 16 }}
[federation]
rounds = 1
clients_per_round = 2
[scheme]
name = "fl-std"
"""


@pytest.fixture
def tiny(tmp_path):
    """A 5-client config on scikit-learn's digits (8x8): loads in well under a second."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(dataset="digits", options="{}", features=64))
    return path


def export(*args):
    return CliRunner().invoke(app, ["data", "export", *map(str, args)], terminal_width=200)


def expected(config, client):
    """Client `client`'s training and held-out data as the simulator builds them."""
    cfg = load_config(config)
    fed = build_federation(cfg, Seeds(cfg.seed))
    test = site_test_split(len(fed.y_test), cfg.data.n_clients, cfg.seed)[client]
    train = fed.clients[client]
    return (fed.x[train], fed.y[train]), (fed.x_test[test], fed.y_test[test])


def test_npz_export_is_the_simulators_partition_and_test_share(tiny, tmp_path):
    r = export("--config", tiny, "--client", 2, "--format", "npz", "--out", tmp_path / "c2.npz",
               "--test-out", tmp_path / "c2-test.npz")
    assert r.exit_code == 0, r.output
    (x, y), (xt, yt) = expected(tiny, 2)
    site, held_out = load_site_data(tmp_path / "c2.npz"), load_site_data(tmp_path / "c2-test.npz")
    assert torch.equal(site.x, x) and torch.equal(site.y, y)
    assert torch.equal(held_out.x, xt) and torch.equal(held_out.y, yt)
    assert f"client 2: {len(y)} examples [1, 8, 8]" in r.output


def test_csv_export_of_every_client_round_trips_exactly(tiny, tmp_path):
    r = export("--config", tiny, "--format", "csv", "--all", tmp_path / "all")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(
        f"client-{i}{s}.csv" for i in range(5) for s in ("", "-test"))
    assert "shape=1,8,8" in r.output
    for i in range(5):
        (x, y), (xt, yt) = expected(tiny, i)
        site = load_site_data(tmp_path / "all" / f"client-{i}.csv", shape="1,8,8", input_shape=(1, 8, 8),
                              n_classes=10, like="digits")
        held_out = load_site_data(tmp_path / "all" / f"client-{i}-test.csv", shape="1,8,8")
        assert torch.equal(site.x, x) and torch.equal(site.y, y)
        assert torch.equal(held_out.x, xt) and torch.equal(held_out.y, yt)
        assert len(held_out) == 360 // 5  # digits keeps 360 test images: 72 a site


def test_image_export_says_when_it_rounds(tiny, tmp_path):
    r = export("--config", tiny, "--client", 0, "--format", "images", "--out", tmp_path / "c0")
    assert r.exit_code == 0, r.output
    assert "not 8-bit pixels" in r.output  # digits are k/16, not k/255
    (x, y), _ = expected(tiny, 0)
    site = load_site_data(tmp_path / "c0", n_classes=10)
    order = torch.from_numpy(np.argsort(y.numpy(), kind="stable"))
    assert torch.equal(site.y, y[order])
    assert float((site.x - x[order]).abs().max()) <= 0.5 / 255 + 1e-6
    assert not torch.equal(site.x, x[order])


@pytest.mark.fashion_mnist
def test_image_export_of_fashion_mnist_is_exact(tmp_path):
    config = tmp_path / "f.toml"
    config.write_text(TINY.format(dataset="fashion-mnist", options="{ n_train = 500, n_test = 50 }",
                                  features=784))
    r = export("--config", config, "--client", 1, "--format", "images", "--out", tmp_path / "c1",
               "--test-out", tmp_path / "c1-test")
    assert r.exit_code == 0, r.output
    assert "not 8-bit" not in r.output
    for path, (x, y) in zip(("c1", "c1-test"), expected(config, 1)):
        site = load_site_data(tmp_path / path, input_shape=(1, 28, 28), n_classes=10, like="fashion-mnist")
        order = torch.from_numpy(np.argsort(y.numpy(), kind="stable"))
        assert torch.equal(site.x, x[order]) and torch.equal(site.y, y[order])


@pytest.mark.parametrize("args,match", [
    (["--config", "{tmp}/nope.toml", "--client", "0", "--format", "npz", "--out", "{tmp}/a.npz"],
     "error: config file not found"),
    (["--config", "{tiny}", "--client", "5", "--format", "npz", "--out", "{tmp}/a.npz"],
     r"error: --client must be in 0..4 \(data.n_clients = 5\), got 5"),
    (["--config", "{tiny}", "--client", "0", "--format", "xlsx", "--out", "{tmp}/a.xlsx"],
     "error: unknown --format 'xlsx'; allowed: csv, npz, images"),
    (["--config", "{tiny}", "--format", "npz", "--out", "{tmp}/a.npz"],
     "error: give --client I and --out PATH"),
    (["--config", "{tiny}", "--client", "0", "--format", "npz", "--all", "{tmp}/d"],
     "error: --all writes every"),
    (["--config", "{tiny}", "--client", "0", "--format", "csv", "--out", "{tmp}/a.npz"],
     r"error: .*a\.npz: a csv file must end in \.csv"),
    (["--config", "quickstart", "--client", "100", "--format", "csv", "--out", "{tmp}/a.csv"],
     r"error: --client must be in 0..99 \(data.n_clients = 100\)"),  # a built-in config name
])
def test_bad_input_is_one_error_line_and_exit_code_2(tiny, tmp_path, args, match):
    r = export(*(a.format(tmp=tmp_path, tiny=tiny) for a in args))
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(match, errors[0]), r.output
    assert "Traceback" not in r.output
