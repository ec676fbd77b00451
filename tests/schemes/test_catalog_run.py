"""The ch. 4 schemes end to end in the simulator: they learn, their bytes are the payloads', and every
thesis table config loads."""

import json

import numpy as np
import pytest

from dpfl.compression.subset import count_for_ratio
from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.experiments.reproduce import list_tables, table_rows
from dpfl.run.state import Run


def _cfg(scheme, rounds=12, **opts):
    return load_config(data={
        "name": scheme, "seed": 2,
        "data": {"dataset": "digits", "n_clients": 60, "public_size": 10},
        "federation": {"rounds": rounds, "clients_per_round": 10},
        "train": {"steps": 5, "batch_size": 10, "lr": 0.3},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 32}},
        "scheme": {"name": scheme, "options": opts},
        "eval": {"every": 1},
    })


def _metrics(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


N_PARAMS = 64 * 32 + 32 + 32 * 10 + 10  # the MLP above


@pytest.mark.parametrize("scheme, opts, up_bytes, down_bytes", [
    ("fl-sign", {"gamma": 0.01}, (N_PARAMS + 7) // 8, 4 * N_PARAMS),
    ("fl-rnd", {"ratio": 0.2}, 4 * count_for_ratio(0.2, N_PARAMS), 4 * N_PARAMS),
    ("fl-freq", {"ratio": 0.2}, 4 * count_for_ratio(0.2, N_PARAMS), 4 * N_PARAMS),
    ("fl-cs", {"ratio": 0.2, "chunks": 4, "server_lr": 1.0}, 4 * count_for_ratio(0.2, N_PARAMS), 4 * N_PARAMS),
    ("fl-top", {"ratio": 0.2}, 4 * count_for_ratio(0.2, N_PARAMS), 4 * count_for_ratio(0.2, N_PARAMS)),
    ("fl-basic", {"ratio": 0.2}, 4 * count_for_ratio(0.2, N_PARAMS), 4 * N_PARAMS),
])
def test_scheme_learns_and_counts_its_payload_bytes(tmp_path, scheme, opts, up_bytes, down_bytes):
    sim = Run(_cfg(scheme, **opts), tmp_path, log=lambda s: None)
    assert sim.w.numel() == N_PARAMS
    summary = simulate(sim)
    m = _metrics(tmp_path)
    # cumulative bytes / N: each round 10 of 60 clients send one payload and get one model
    assert m[-1]["cum_up_bytes_per_client"] * 60 == pytest.approx(12 * 10 * up_bytes, abs=12 * 10 * 16)
    assert m[-1]["cum_down_bytes_per_client"] * 60 == pytest.approx(12 * 10 * down_bytes, rel=1e-9)
    acc = [r["accuracy"] for r in m]
    assert summary["best"]["accuracy"] > max(0.3, acc[0] + 0.1), (scheme, acc)  # chance is 0.1


@pytest.mark.parametrize("scheme", ["fl-std", "fl-sign", "fsvrg"])
def test_downstream_bytes_are_the_model_payloads_not_a_formula(tmp_path, monkeypatch, scheme):
    """A codec that adds a 12-byte header to each float32 payload shows up in the bytes down."""
    from dpfl.compression.base import Float32Codec, Payload

    plain = Float32Codec.encode

    def with_header(self, rows, rng=None):
        p = plain(self, rows, rng)
        return Payload({**p.arrays, "header": np.zeros((p.k, 3), np.float32)}, p.meta)

    monkeypatch.setattr(Float32Codec, "encode", with_header)
    opts = {"h": 0.5} if scheme == "fsvrg" else {}
    sim = Run(_cfg(scheme, rounds=1, **opts), tmp_path, log=lambda s: None)
    simulate(sim)
    payloads = 2 if scheme == "fsvrg" else 1  # FSVRG: the model, then the full gradient
    assert _metrics(tmp_path)[-1]["down_bytes"] == 10 * payloads * (4 * N_PARAMS + 12)


def test_signsgd_uses_every_client_and_one_bit_downstream(tmp_path):
    cfg = _cfg("signsgd", rounds=3, gamma=0.01)
    sim = Run(cfg, tmp_path, log=lambda s: None)
    simulate(sim)
    m = _metrics(tmp_path)
    bits = (N_PARAMS + 7) // 8
    assert m[-1]["cum_up_bytes_per_client"] == pytest.approx(3 * bits, abs=3 * 16)
    assert m[-1]["cum_down_bytes_per_client"] == pytest.approx(3 * bits, abs=3 * 16)


def test_fl_top_only_changes_its_topk_coordinates(tmp_path):
    sim = Run(_cfg("fl-top", rounds=3, ratio=0.1), tmp_path, log=lambda s: None)
    w0 = sim.w.clone()
    simulate(sim)
    changed = (sim.w != w0).nonzero().flatten()
    top = sim.scheme.steps[0].indices
    assert len(changed) > 0 and bool(np.isin(changed.numpy(), top.cpu().numpy()).all())


def test_bad_ratio_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="ratio"):
        simulate(Run(_cfg("fl-rnd", ratio=1.5), tmp_path, log=lambda s: None))


def test_every_table_config_loads():
    tables = list_tables()
    for t in ("table-4.1", "table-4.2", "table-4.4", "table-5.1", "table-5.3", "table-5.5"):
        assert t in tables
    for t in tables:
        thesis, rows = table_rows(t)
        for row, path in rows.items():
            load_config(path)
            assert row in thesis, f"{t}: row {row} has no thesis entry"
