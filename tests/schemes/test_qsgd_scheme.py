"""QSGD and QSGD-DP in the simulator: they learn, their bytes are the codec's packing, runs repeat
bit for bit, and QSGD-DP's ε is the Gaussian mechanism's from the ledger."""

import inspect
import json
import math

import pytest

from dpfl.compression.qsgd import QSGDCodec
from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.privacy import GaussianEvent, Ledger, epsilon_for
from dpfl.run.state import Run
from dpfl.schemes import catalog_qsgd

N_PARAMS = 64 * 32 + 32 + 32 * 10 + 10  # the MLP below
TIMING = ("train_seconds", "eval_seconds", "round_seconds", "step_dp_noise_seconds")


def _cfg(scheme, rounds=12, **opts):
    return load_config(data={
        "name": scheme, "seed": 2,
        "data": {"dataset": "digits", "n_clients": 60, "public_size": 10},
        "federation": {"rounds": rounds, "clients_per_round": 10},
        "train": {"steps": 5, "batch_size": 10, "lr": 0.3},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 32}},
        "scheme": {"name": scheme, "options": opts},
        "privacy": {"accountant": "rdp", "delta": 1e-5, "sampling_assumption": "poisson"}, "eval": {"every": 1},
    })


def _run(tmp_path, scheme, rounds=12, **opts):
    sim = Run(_cfg(scheme, rounds, **opts), tmp_path, log=lambda s: None)
    summary = simulate(sim)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return sim, summary, [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.parametrize("levels, bucket", [(15, 512), (1, 64)])
def test_qsgd_learns_and_sends_its_packed_bytes(tmp_path, levels, bucket):
    _, summary, m = _run(tmp_path, "qsgd", levels=levels, bucket=bucket)
    per_round = QSGDCodec(levels, bucket).nbytes(N_PARAMS)
    assert [r["up_bytes"] for r in m] == [10 * per_round] * 12
    assert summary["best"]["accuracy"] > max(0.5, m[0]["accuracy"] + 0.2)  # chance is 0.1


def test_qsgd_same_seed_same_run(tmp_path):
    a = _run(tmp_path / "a", "qsgd", rounds=3)[2]
    b = _run(tmp_path / "b", "qsgd", rounds=3)[2]
    assert a == b


def test_qsgd_dp_central_epsilon_is_the_sampled_gaussians_and_it_learns(tmp_path):
    sim, summary, m = _run(tmp_path, "qsgd-dp", noise="central", sigma=0.5, clip=2.0, bucket=64)
    assert [r["epsilon"] for r in m] == [pytest.approx(epsilon_for(0.5, 10 / 60, r, 1e-5, "rdp"), rel=1e-12)
                                         for r in range(1, 13)]
    noise = sim.scheme.steps[-1]
    assert noise.clip.bound == pytest.approx(2.0 * (1 + math.sqrt(64) / 15), rel=1e-5)  # ‖Q(v)‖ bound
    assert summary["best"]["accuracy"] > max(0.3, m[0]["accuracy"] + 0.1)


def test_qsgd_dp_local_epsilon_is_the_local_gaussians(tmp_path):
    sim, _, m = _run(tmp_path, "qsgd-dp", rounds=2, sigma=2.0, clip=1.0)
    assert [s.name for s in sim.scheme.steps] == ["clip", "gaussian_noise", "qsgd"]  # noise, then quantize
    ref = Ledger("rdp")
    ref.add(GaussianEvent(1.0))  # round 1: every client in it has taken part once; no amplification
    assert m[0]["epsilon"] == pytest.approx(ref.epsilon(1e-5), rel=1e-12)
    assert m[0]["up_bytes"] == 10 * QSGDCodec().nbytes(N_PARAMS)


def test_qsgd_dp_refuses_distributed_noise_and_bad_options(tmp_path):
    with pytest.raises(ConfigError, match="distributed"):
        Run(_cfg("qsgd-dp", noise="distributed", sigma=1.0), tmp_path, log=lambda s: None)
    with pytest.raises(ConfigError, match="levels"):
        Run(_cfg("qsgd", levels=0), tmp_path, log=lambda s: None)
    with pytest.raises(ConfigError, match="clip"):
        Run(_cfg("qsgd-dp", sigma=1.0, clip="auto"), tmp_path, log=lambda s: None)


def test_definitions_stay_short():
    for fn in (catalog_qsgd.qsgd, catalog_qsgd.qsgd_dp):
        assert len(inspect.getsource(fn).splitlines()) <= 16, fn.__name__
