"""Clip-bound selection (dpfl.schemes.sensitivity) against gradients computed directly with autograd.

With one local step over a client's whole data (batch = |D_k|), an update is Δ = −η·∇L(w₀; D_k)
whatever the batch order, so the reference norms need no engine internals.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpfl.compression.subset import random_subset
from dpfl.config import load_config
from dpfl.privacy import PureDPEvent
from dpfl.run.state import Run
from dpfl.schemes.sensitivity import dp_quantile, quantile_utility

LR = 0.1


def _sim(scheme, privacy=None, **opts):
    cfg = load_config(data={
        "privacy": privacy or {},
        "seed": 2,
        "data": {"dataset": "digits", "n_clients": 40, "partition_options": {"size": 20}, "public_size": 10},
        "federation": {"rounds": 1, "clients_per_round": 5},
        "train": {"steps": 1, "batch_size": 20, "lr": LR},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 8}},
        "scheme": {"name": scheme, "options": {"sigma": 1.0, **opts}},
    })
    sim = Run(cfg, None, log=lambda s: None)
    sim.setup()
    return sim


def _update(sim, x, y, mask=None):
    """−η ∇ mean CE at w₀, flat in named_parameters order (independent of the engine trainer)."""
    model = sim.model
    sim.flat.load_into(model, sim.w)
    model.zero_grad()
    F.cross_entropy(model(x.float()), y).backward()
    g = torch.cat([p.grad.reshape(-1) for _, p in model.named_parameters()])
    g = -LR * g
    return g if mask is None else g * mask


def _clip(sim):
    return next(s for s in sim.scheme.steps if s.name == "clip")


def test_client_median_is_the_median_of_the_clients_update_norms():
    sim = _sim("fl-std-dp")
    ref = [float(_update(sim, sim.fed.x[c], sim.fed.y[c]).double().norm()) for c in sim.fed.clients]
    assert _clip(sim).bound == pytest.approx(float(np.median(ref)), rel=1e-4)
    assert "NOT charged" in _clip(sim).how


def test_client_median_applies_the_compression_first():
    sim = _sim("fl-rnd-dp", ratio=0.3)
    sub = sim.scheme.steps[0]
    idx = sub.subset(_round0(sim))
    ref = [float(_update(sim, sim.fed.x[c], sim.fed.y[c])[idx].double().norm()) for c in sim.fed.clients]
    assert _clip(sim).bound == pytest.approx(float(np.median(ref)), rel=1e-4)


def _round0(sim):
    from dpfl.schemes.sensitivity import _round0 as r0

    return r0(_setup_ctx(sim), np.arange(len(sim.fed.clients)))


def _setup_ctx(sim):
    from dpfl.schemes.base import SetupContext

    return SetupContext(n_params=sim.flat.n, seeds=sim.seeds, device=sim.device, initial_params=sim.w.clone(),
                        n_clients=40, cohort_size=5)


def test_public_topk_and_public_random_norms():
    sim = _sim("fl-top-dp", ratio=0.1)
    top = sim.scheme.steps[0]
    x, y = sim.fed.public
    mask = torch.zeros(sim.flat.n)
    mask[top.indices] = 1
    ref = float(_update(sim, x, y, mask)[top.indices].double().norm())
    assert _clip(sim).bound == pytest.approx(ref, rel=1e-4)
    assert "public" in _clip(sim).how

    sim = _sim("fl-basic-dp", ratio=0.1, clip_repeats=7)
    k = sim.scheme.steps[0].k
    norms = []
    for j in range(7):
        idx = random_subset(sim.flat.n, k, sim.seeds.numpy("dp-clip", "subset", j))
        m = torch.zeros(sim.flat.n)
        m[idx] = 1
        norms.append(float(_update(sim, x, y, m)[idx].double().norm()))
    assert _clip(sim).bound == pytest.approx(float(np.median(norms)), rel=1e-4)


@pytest.mark.parametrize("sampling,charged", [("poisson", 0.7), ("without-replacement", 1.4)])
def test_private_median_is_charged_to_the_ledger(sampling, charged):
    # ε₀ under add/remove; replacing one client moves the median's utility twice as far: 2ε₀
    sim = _sim("fl-std-dp", privacy={"sampling_assumption": sampling}, clip="private", clip_epsilon=0.7)
    assert sim.ledger.neighbouring == ("replace_one" if sampling == "without-replacement" else "add_remove")
    assert sim.ledger.events == [(PureDPEvent(charged), 1)]
    assert "charged" in _clip(sim).how and "NOT" not in _clip(sim).how


def test_quantile_utility_sensitivity_by_brute_force():
    rng = np.random.default_rng(0)
    cand = np.geomspace(1e-3, 1e3, 400)
    for p in (0.5, 0.1, 0.9):
        for _ in range(50):
            v = rng.lognormal(0, 2, size=rng.integers(1, 30))
            extra = rng.lognormal(0, 2)
            gap = np.abs(quantile_utility(v, cand, p) - quantile_utility(np.append(v, extra), cand, p))
            assert gap.max() <= max(p, 1 - p) + 1e-12


def test_dp_quantile_is_accurate_for_many_clients():
    from dpfl.rng import CryptoRNG

    v = np.random.default_rng(1).lognormal(0.5, 0.4, size=6000)
    lo, hi = np.quantile(v, [0.45, 0.55])
    out = [dp_quantile(v, 0.5, CryptoRNG(key=bytes([i]) * 32)) for i in range(20)]
    assert all(lo <= s <= hi for s in out)
