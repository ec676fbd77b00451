"""The round keeps its tensors on `run.device`. The CUDA tests run where torch sees a CUDA device and skip
elsewhere; the secure sum's device is also checked on CPU-only machines, through the meta device."""

import json

import numpy as np
import pytest
import torch

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.rng import Seeds
from dpfl.run.state import Run
from dpfl.schemes.base import RoundContext
from dpfl.schemes.secure_sum import SecAggTransport
from dpfl.training.evaluate import evaluate

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _ctx(k: int, d: int, device: str) -> RoundContext:
    return RoundContext(round=1, n_params=d, cohort=np.arange(k), n_selected=k, weights=torch.ones(k),
                        seeds=Seeds(0), device=torch.device(device), global_params=torch.zeros(d))


@pytest.mark.parametrize("encoding,rows", [("fixed", torch.full((4, 3), 0.25)),
                                           ("int", torch.full((4, 3), 2, dtype=torch.int32))])
def test_secure_sum_hands_the_aggregate_over_on_the_rounds_device(encoding, rows):
    opts = {"clip_range": 1.0} if encoding == "fixed" else {"bits": 12}
    # the protocol itself runs on the CPU (and consumes the rows it is given: each call gets its own copy)
    rec = SecAggTransport(encoding, **opts).transmit(rows.clone(), _ctx(4, 3, "meta"))
    assert rec.total.device.type == "meta"
    on_cpu = SecAggTransport(encoding, **opts).transmit(rows.clone(), _ctx(4, 3, "cpu")).total
    assert on_cpu.tolist() == ([1.0] * 3 if encoding == "fixed" else [8] * 3)


def _run(tmp_path, device: str, scheme: str, dpsgd: dict | None = None, **opts) -> tuple[Run, list[dict]]:
    cfg = load_config(data={
        "name": "device", "seed": 5,
        "data": {"dataset": "digits", "n_clients": 30},
        "federation": {"rounds": 2, "clients_per_round": 6},
        "train": {"steps": 2, "batch_size": 10, "lr": 0.1, **({"dpsgd": dpsgd} if dpsgd else {})},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
        "scheme": {"name": scheme, "options": opts},
        "privacy": {"accountant": "rdp", "delta": 1e-5, "sampling_assumption": "poisson"}, "eval": {"every": 1},
        "run": {"device": device, "checkpoint_every": 2},
    })
    sim = Run(cfg, tmp_path / device, log=lambda s: None)
    simulate(sim)
    rows = [json.loads(x) for x in (tmp_path / device / "metrics.jsonl").read_text().splitlines()]
    return sim, rows


def _same_round_up_to_float_rounding(a: list[dict], b: list[dict]) -> None:
    assert [r["round"] for r in a] == [r["round"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        for key in ("cum_up_bytes_per_client", "cum_down_bytes_per_client", "epsilon", "step_secagg_bits",
                    "step_secagg_survivors"):
            assert ra.get(key) == rb.get(key), key
        assert ra["accuracy"] == pytest.approx(rb["accuracy"], abs=0.05)  # kernels differ in the last bits


@cuda
@pytest.mark.parametrize("scheme,opts", [
    ("fl-std", {}),
    ("fl-std-dp", {"sigma": 1.0, "clip": 0.5, "secure_aggregation": True}),
    ("fl-sign-dp", {"sigma": 1.0, "secure_aggregation": True}),
])
def test_a_run_on_cuda_stays_there_and_matches_the_cpu_run(tmp_path, scheme, opts):
    sim, on_gpu = _run(tmp_path, "cuda", scheme, **opts)
    assert sim.w.device.type == "cuda"
    assert ("step_secagg_bits" in on_gpu[0]) == bool(opts.get("secure_aggregation"))
    _, on_cpu = _run(tmp_path, "cpu", scheme, **opts)
    _same_round_up_to_float_rounding(on_gpu, on_cpu)


@cuda
def test_record_level_dpsgd_on_cuda_matches_the_cpu_run(tmp_path):
    dpsgd = {"clip": 1.0, "noise_multiplier": 1.1, "delta": 1e-5}
    sim, on_gpu = _run(tmp_path, "cuda", "fl-std", dpsgd=dpsgd)
    assert sim.w.device.type == "cuda"
    _, on_cpu = _run(tmp_path, "cpu", "fl-std", dpsgd=dpsgd)
    _same_round_up_to_float_rounding(on_gpu, on_cpu)
    for key in ("record_epsilon_max", "record_epsilon_median", "record_epsilon_per_client"):
        assert [r[key] for r in on_gpu] == [r[key] for r in on_cpu], key


@cuda
def test_binary_evaluation_on_cuda():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 5, generator=g), (torch.rand(300, generator=g) < 0.4).long()
    model = torch.nn.Linear(5, 1)
    on_cpu = evaluate(model, x, y, "binary")
    on_gpu = evaluate(model.to("cuda"), x.to("cuda"), y.to("cuda"), "binary")
    assert set(on_gpu) == {"loss", "accuracy", "balanced_accuracy", "auroc"}
    for key, v in on_cpu.items():
        assert on_gpu[key] == pytest.approx(v, rel=1e-5), key
