"""evaluation = "federated": the server loads no dataset; the sites evaluate, and the run records
their data hashes (in process, over the loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import torch
from flower_helpers import (
    SIGN_DP,
    config,
    held_out_counts,
    node_configs,
    require_row_contract,
    simulate,
    site_files,
)

import dpfl.data
from dpfl.config import load_config
from dpfl.errors import ConfigError, DataError
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback
from dpfl.flower.node import LocalClient, NodeSettings
from dpfl.run import checkpoint as ckpt
from dpfl.run.state import CHECKPOINT, CONFIG, METRICS, RUN_FILES, SUMMARY


def _sites(data: dict, files: dict[int, dict]) -> Loopback:
    return Loopback({"dpfl-config": tomli_w.dumps(data)},
                    {100 + i: {"partition-id": i, "num-partitions": 3, "dpfl-seeded": True, **files[i]} for i in files})


def _no_dataset(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("the server loaded a dataset")

    monkeypatch.setattr(dpfl.data, "load_dataset", refuse)


def test_a_federated_only_server_loads_no_data_and_ends_as_the_simulator(tmp_path, monkeypatch):
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 3, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    sim, _ = simulate(data)
    cfg = load_config(data=data)
    _no_dataset(monkeypatch)
    out = tmp_path / "out"
    co = Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                     log=lambda s: None, evaluation="federated")
    summary = co.run()
    monkeypatch.undo()
    salt = co.state.site_salt
    hashes = {str(i): LocalClient(cfg, NodeSettings(i, f["data-path"], True, f["test-path"],
                                                    data_shape=f.get("data-shape"))).data_mac(salt)
              for i, f in files.items()}
    assert len(salt) == 32 and salt.hex() not in json.dumps(summary) and salt.hex() not in (out / CONFIG).read_text()
    assert co.state.fed is None
    assert torch.equal(co.state.w, sim.w)
    lines = [json.loads(ln) for ln in (out / METRICS).read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2, 3]
    for m in lines:
        assert m["fed_sites"] == 3 and m["fed_examples"] > 0 and "fed_loss" in m
        assert "accuracy" not in m and "loss" not in m  # no server-side evaluation
    want = held_out_counts(data, sim.w)
    assert lines[-1]["fed_accuracy"] == want["correct"] / want["n"]
    best = max(lines, key=lambda m: m["fed_accuracy"])
    assert summary["best"]["metric"] == "fed_accuracy" and summary["best"]["round"] == best["round"]
    assert summary["best"]["fed_accuracy"] == best["fed_accuracy"]
    assert len(set(hashes.values())) == 3 and summary["data"]["sites"] == hashes
    assert json.loads((out / SUMMARY).read_text())["data"] == summary["data"] == ckpt.load(out / CHECKPOINT)["data"]
    assert ckpt.load(out / CHECKPOINT)["sites"] == hashes and ckpt.load(out / CHECKPOINT)["site_salt"] == salt
    head = (out / CONFIG).read_text()
    assert all(f"# site {i}: data MAC {h}\n" in head for i, h in hashes.items())
    assert {p.name for p in out.iterdir()} == set(RUN_FILES)


def test_a_resumed_federated_run_refuses_a_site_whose_data_changed(tmp_path, monkeypatch):
    require_row_contract()
    data = config(SIGN_DP, federation={"rounds": 2, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    cfg = load_config(data=data)
    _no_dataset(monkeypatch)
    out = tmp_path / "out"
    Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                log=lambda s: None, evaluation="federated").run()
    recorded = json.loads((out / SUMMARY).read_text())["data"]

    def resume() -> dict:
        return Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                           log=lambda s: None, resume=True, evaluation="federated").run()

    test = Path(files[1]["test-path"])  # site 1's held-out file changes: one example fewer
    kept = test.read_bytes()
    with np.load(test) as f:
        np.savez(test, x=f["x"][1:], y=f["y"][1:])
    with pytest.raises(DataError, match=r"^client 1's data differ from the run's \(data MAC [0-9a-f]{12}, the run "
                                        r"recorded [0-9a-f]{12}; or its site key changed\): refused$"):
        resume()
    test.write_bytes(kept)
    assert resume()["data"] == recorded  # the same data again: the run goes on
    with pytest.raises(ConfigError, match=r"was run by a server holding no data \(evaluation = 'federated'\); "
                                          r"resume it with the same evaluation$"):
        Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                    log=lambda s: None, resume=True, evaluation="both")  # (refused before loading data)


def test_a_resumed_run_with_server_data_checks_the_sites_data_too(tmp_path):
    data = config(federation={"rounds": 2, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    cfg, out = load_config(data=data), tmp_path / "out"
    first = Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                        log=lambda s: None, evaluation="both")
    first.run()
    assert sorted(ckpt.load(out / CHECKPOINT)["sites"]) == ["0", "1", "2"]
    test = Path(files[2]["test-path"])
    with np.load(test) as f:
        np.savez(test, x=f["x"][1:], y=f["y"][1:])
    with pytest.raises(DataError, match=r"^client 2's data differ from the run's"):
        Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                    log=lambda s: None, resume=True, evaluation="both").run()


@pytest.mark.parametrize("sites, salt", [({"99": "a" * 64}, b"s" * 32), ({"\u0661": "a" * 64}, b"s" * 32),
                                         ({"01": "a" * 64}, b"s" * 32), ({"1": "A" * 64}, b"s" * 32),
                                         ({"1": "a" * 64}, None), ({}, b"s" * 31)])
def test_a_checkpoints_site_macs_are_checked(tmp_path, sites, salt, monkeypatch):
    data = config(federation={"rounds": 1, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    cfg, out = load_config(data=data), tmp_path / "out"
    _no_dataset(monkeypatch)
    Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                log=lambda s: None, evaluation="federated").run()
    st = ckpt.load(out / CHECKPOINT)
    ckpt.save({**st, "sites": sites, "site_salt": salt}, out / CHECKPOINT)
    with pytest.raises(DataError, match="checkpoint.pt: does not fit this run .*'s(ites|ite_salt)'"):
        Coordinator(cfg, _sites(data, files), list(range(100, 103)), out_dir=out, reproducible=True,
                    log=lambda s: None, resume=True, evaluation="federated")


def test_each_run_salts_the_sites_data_macs_afresh(tmp_path):
    data = config(federation={"rounds": 1, "clients_per_round": 3})
    files = site_files(data, tmp_path)
    cfg = load_config(data=data)
    runs = [Coordinator(cfg, _sites(data, files), list(range(100, 103)), log=lambda s: None, evaluation="federated")
            for _ in range(2)]
    for co in runs:
        co.run()
    (a, b) = runs
    assert a.state.site_salt != b.state.site_salt and len(a.state.site_salt) == 32
    assert set(a.state.sites) == set(b.state.sites) == {0, 1, 2}
    assert all(a.state.sites[c] != b.state.sites[c] for c in range(3))  # the same data, unrelated MACs


def test_a_run_whose_server_held_data_is_not_resumed_without(tmp_path):
    data = config(federation={"rounds": 1, "clients_per_round": 3})
    cfg, out = load_config(data=data), tmp_path / "out"
    lb = Loopback({"dpfl-config": tomli_w.dumps(data)}, node_configs(3))
    Coordinator(cfg, lb, lb.nodes, out_dir=out, reproducible=True, log=lambda s: None, evaluation="both").run()
    with pytest.raises(ConfigError, match=r"was run by a server holding data \(evaluation = 'server' or 'both'\); "
                                          r"resume it with the same evaluation$"):
        Coordinator(cfg, lambda *a, **k: {}, [100, 101, 102], out_dir=out, resume=True, evaluation="federated")


def test_a_best_metric_other_than_accuracy_needs_the_servers_evaluation(monkeypatch):
    _no_dataset(monkeypatch)
    with pytest.raises(ConfigError, match=r"^eval.metric = 'balanced_accuracy' needs the server's evaluation"):
        Coordinator(load_config(data=config(eval={"metric": "balanced_accuracy"})), lambda *a, **k: {},
                    [100, 101, 102], evaluation="federated")


@pytest.mark.parametrize("scheme, option", [
    ({"name": "fl-std-dp", "options": {"sigma": 1.0}}, "scheme.options.clip = 'auto'"),
    ({"name": "fl-std-dp", "options": {"sigma": 1.0, "clip": "private"}}, "scheme.options.clip = 'private'"),
    ({"name": "fl-top", "options": {"ratio": 0.1}}, "scheme 'fl-top' (its Top-K set"),
    ({"name": "fl-top-dp", "options": {"sigma": 1.0}}, "scheme 'fl-top-dp' (its Top-K set"),
    ({"name": "sub-fedavg", "options": {}}, "scheme.options.personal_eval = 500 (sub-fedavg's personal models"),
])
def test_a_scheme_that_needs_server_data_is_refused_in_one_line(scheme, option, monkeypatch):
    data = config(scheme, data={"public_size": 50})  # (FL-TOP's public set, on a server with data)
    _no_dataset(monkeypatch)
    with pytest.raises(ConfigError) as e:
        Coordinator(load_config(data=data), lambda *a, **k: {}, [100, 101, 102], evaluation="federated")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(option) and "needs data on the server" in msg
    assert msg.endswith("use evaluation = 'server' or 'both'")
    monkeypatch.undo()
    Coordinator(load_config(data=data), lambda *a, **k: {}, [100, 101, 102], evaluation="both")  # with data: as before
