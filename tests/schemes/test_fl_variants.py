"""The survey's FL variants (fedprox, fsvrg, feddyn, sub-fedavg): they learn on tiny digits, match
per-client reference loops written with plain autograd, resume bit-identically, keep client state
only for clients seen, and reject bad options by name."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from dpfl.config import load_config
from dpfl.engine.simulator import Simulator, simulate
from dpfl.errors import ConfigError
from dpfl.models import build_model
from dpfl.run.state import Run
from dpfl.schemes.sampling import local_positions
from dpfl.training.trainer import LocalTraining, Trainer


def _cfg(scheme, rounds=12, partition="shards", checkpoint_every=10, lr=0.3, **opts):
    return load_config(data={
        "name": scheme, "seed": 2,
        "data": {"dataset": "digits", "n_clients": 60, "partition": partition},
        "federation": {"rounds": rounds, "clients_per_round": 10},
        "train": {"steps": 5, "batch_size": 10, "lr": lr},
        "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 32}},
        "scheme": {"name": scheme, "options": opts},
        "eval": {"every": 1},
        "run": {"checkpoint_every": checkpoint_every},
    })


def _metrics(out):
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for m in rows:
        for k in ("train_seconds", "eval_seconds", "round_seconds"):
            m.pop(k, None)
    return rows


def _sim(scheme, **kw):
    return Run(_cfg(scheme, **kw), None, log=lambda s: None)


def _grad(sim, theta, idx):
    """Reference ∇ of the mean cross-entropy over the samples `idx` at flat parameters `theta`."""
    p = theta.detach().clone().requires_grad_(True)
    out = functional_call(sim.model, sim.flat.views(p), (sim.fed.x[idx],))
    (g,) = torch.autograd.grad(F.cross_entropy(out, sim.fed.y[idx]), p)
    return g


# ---- they learn ---------------------------------------------------------------------------------
_BEST: dict[str, float] = {}


def _best(scheme, **opts):
    key = f"{scheme}{sorted(opts.items())}"
    if key not in _BEST:
        _BEST[key] = simulate(_sim(scheme, **opts))["best"]["accuracy"]
    return _BEST[key]


@pytest.mark.parametrize("scheme, opts", [
    ("fedprox", {"mu": 0.1}),
    ("fsvrg", {"h": 1.0}),
    ("feddyn", {"alpha": 0.01}),
    ("sub-fedavg", {"sparsity": 0.5, "prune_rate": 0.2}),
])
def test_variant_learns_like_fl_std(scheme, opts):
    base = _best("fl-std")
    best = _best(scheme, **opts)
    print(f"{scheme} {opts}: best accuracy {best:.3f} (fl-std {base:.3f})")
    assert best > 0.8, (scheme, best)  # chance is 0.1
    assert best > base - 0.06, (scheme, best, base)


# ---- FedProx ------------------------------------------------------------------------------------
def test_fedprox_mu_zero_is_fl_std_bit_for_bit(tmp_path):
    a = Run(_cfg("fl-std", rounds=3), tmp_path / "a", log=lambda s: None)
    simulate(a)
    b = Run(_cfg("fedprox", rounds=3, mu=0.0), tmp_path / "b", log=lambda s: None)
    simulate(b)
    assert torch.equal(a.w, b.w)
    assert _metrics(tmp_path / "a") == _metrics(tmp_path / "b")


def test_fedprox_large_mu_keeps_updates_small():
    norms = []
    for mu in (0.0, 2.0, 8.0, 19.0):  # lr·μ up to 0.95: the proximal step stays a contraction
        sim = _sim("fedprox", rounds=1, lr=0.05, mu=mu)
        w0 = sim.w.clone()
        Simulator(sim).step_round()
        norms.append(float((sim.w - w0).norm()))
    assert norms == sorted(norms, reverse=True) and norms[-1] < 0.5 * norms[0], norms


# ---- FedDyn -------------------------------------------------------------------------------------
def test_feddyn_matches_a_per_client_reference():
    alpha, lr = 0.1, 0.3
    sim = _sim("feddyn", alpha=alpha)
    step = sim.scheme.steps[0]
    w, h, mem, m = sim.w.clone(), torch.zeros_like(sim.w), {}, 60
    for r in (1, 2, 3):
        cohort, _ = sim.select(r)
        batches = Simulator(sim).batches(r, cohort)
        deltas = []
        for i, c in enumerate(cohort):
            g_c = mem.get(int(c), torch.zeros_like(w))
            theta = w.clone()
            for t in range(batches.shape[1]):
                grad = _grad(sim, theta, batches[i, t]) - g_c + alpha * (theta - w)
                theta = theta - lr * grad
            deltas.append(theta - w)
            mem[int(c)] = g_c - alpha * (theta - w)
        d = torch.stack(deltas)
        h = h - alpha / m * d.sum(0)
        w = w + d.mean(0) - h / alpha
        Simulator(sim).step_round()
        torch.testing.assert_close(sim.w, w, rtol=0, atol=2e-5)
        torch.testing.assert_close(step.h, h, rtol=0, atol=1e-6)
        for c, g in mem.items():
            torch.testing.assert_close(step.table.get(np.array([c]))[0], g, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("float16", 2)])
def test_feddyn_state_grows_only_with_clients_seen(dtype, itemsize):
    sim = _sim("feddyn", alpha=0.01, state_dtype=dtype)
    step = sim.scheme.steps[0]
    n, seen = sim.flat.n, set()
    for r in range(1, 6):
        cohort, _ = sim.select(r)
        Simulator(sim).step_round()
        seen |= set(cohort.tolist())
        table = step.table
        assert len(table) == len(seen) < 60
        assert set(table.index) == seen
        assert table.used_nbytes == len(seen) * n * itemsize  # n_params × itemsize × clients seen
        assert table.nbytes <= max(8, math.ceil(1.5 * len(seen))) * n * itemsize
        never = next(c for c in range(60) if c not in seen)
        assert not table.get(np.array([never])).any()  # unseen clients read as zero, store nothing
        assert step.state_dict()["memory"]["rows"].shape == (len(seen), n)


def test_feddyn_resume_is_bit_identical(tmp_path):
    full = Run(_cfg("feddyn", rounds=6, checkpoint_every=2, alpha=0.05), tmp_path / "full",
                      log=lambda s: None)
    simulate(full)

    class Crash(Exception):
        pass

    def crash_at_5(m):
        if m["round"] == 5:
            raise Crash

    part = Run(_cfg("feddyn", rounds=6, checkpoint_every=2, alpha=0.05), tmp_path / "part",
                      log=lambda s: None)
    with pytest.raises(Crash):
        simulate(part, crash_at_5)  # checkpoint at round 4
    resumed = Run.resume(tmp_path / "part", log=lambda s: None)
    assert resumed.round == 4
    saved = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)["scheme"]["steps"][0]
    assert sorted(resumed.scheme.steps[0].table.index) == sorted(saved["memory"]["ids"].tolist())
    simulate(resumed)
    assert _metrics(tmp_path / "part") == _metrics(tmp_path / "full")
    assert torch.equal(resumed.w, full.w)
    a, b = full.scheme.steps[0], resumed.scheme.steps[0]
    assert torch.equal(a.h, b.h)
    ids = sorted(a.table.index)
    assert ids == sorted(b.table.index)
    assert torch.equal(a.table.get(np.array(ids)), b.table.get(np.array(ids)))


# ---- FSVRG --------------------------------------------------------------------------------------
def test_fsvrg_matches_a_per_client_reference():
    h, bs = 1.5, 2
    sim = _sim("fsvrg", partition="quantity", h=h, batch_size=bs)
    w = sim.w.clone()
    for r in (1, 2):
        cohort, _ = sim.select(r)
        sizes = sim.fed.sizes[cohort]
        assert len(set(sizes.tolist())) > 1  # uneven clients: padded steps must be no-ops
        local = [_grad(sim, w, torch.from_numpy(sim.fed.clients[c])) for c in cohort]
        full = sum(float(n) * g for n, g in zip(sizes, local)) / float(sizes.sum())
        steps = -(-sizes // bs)
        pos = local_positions(sizes, int(steps.max()), bs, sim.seeds.numpy("round", r, "batches"))
        deltas = []
        for c, p, m_k in zip(cohort, pos, steps):
            theta = w.clone()
            for t in range(m_k):
                b = torch.from_numpy(sim.fed.clients[c][p[t]])
                theta = theta - (h / m_k) * (_grad(sim, theta, b) - _grad(sim, w, b) + full)
            deltas.append(theta - w)
        wts = torch.tensor(sizes, dtype=torch.float32)
        w = w + (wts / wts.sum()) @ torch.stack(deltas)
        m = Simulator(sim).step_round()
        torch.testing.assert_close(sim.w, w, rtol=0, atol=2e-5)
    n = sim.flat.n
    assert m["up_bytes"] == len(cohort) * 2 * 4 * n  # update + local gradient
    assert m["down_bytes"] == len(cohort) * 2 * 4 * n  # model + full gradient


# ---- Sub-FedAvg ---------------------------------------------------------------------------------
def test_sub_fedavg_matches_a_per_client_reference():
    s, p, lr = 0.5, 0.3, 0.3
    sim = _sim("sub-fedavg", sparsity=s, prune_rate=p)
    step = sim.scheme.steps[0]
    layers = [(off, math.prod(sh)) for sh, off in zip(sim.flat.shapes, sim.flat.offsets) if len(sh) >= 2]
    n_pr = sum(sz for _, sz in layers)
    w, masks = sim.w.clone(), {}
    for r in (1, 2, 3):
        cohort, _ = sim.select(r)
        batches = Simulator(sim).batches(r, cohort)
        total, count = torch.zeros_like(w), torch.zeros_like(w)
        for i, c in enumerate(cohort):
            mk = masks.get(int(c), torch.ones_like(w, dtype=torch.bool))
            theta = w * mk
            for t in range(batches.shape[1]):
                theta = theta - lr * _grad(sim, theta, batches[i, t]) * mk
            density = sum(int(mk[o : o + z].sum()) for o, z in layers) / n_pr
            target = max(density * (1 - p), 1 - s)
            new = mk.clone()
            for o, z in layers:
                keep = min(int(mk[o : o + z].sum()), math.ceil(target * z - 1e-9))
                score = torch.where(mk[o : o + z], theta[o : o + z].abs(), torch.tensor(-1.0))
                order = torch.argsort(score, descending=True, stable=True)
                seg = torch.zeros(z, dtype=torch.bool)
                seg[order[:keep]] = True
                new[o : o + z] = seg
            masks[int(c)] = new
            total += (theta - w) * new
            count += new
        w = w + torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(w))
        Simulator(sim).step_round()
        torch.testing.assert_close(sim.w, w, rtol=0, atol=2e-5)
        for c, mk in masks.items():
            assert torch.equal(step.table.get(np.array([c]))[0], mk)


def test_sub_fedavg_masks_shrink_to_the_target_and_never_prune_biases():
    sim = _sim("sub-fedavg", rounds=20, sparsity=0.6, prune_rate=0.5, personal_eval=200)
    step = sim.scheme.steps[0]
    bias = torch.zeros(sim.flat.n, dtype=torch.bool)
    for sh, off in zip(sim.flat.shapes, sim.flat.offsets):
        if len(sh) < 2:
            bias[off : off + math.prod(sh)] = True
    prev, times, last = {}, {}, None
    for r in range(1, 21):
        cohort, _ = sim.select(r)
        last = Simulator(sim).step_round()
        for c in cohort.tolist():
            times[c] = times.get(c, 0) + 1
            mk = step.table.get(np.array([c]))[0]
            assert mk[bias].all()
            if c in prev:
                assert not (mk & ~prev[c]).any()  # pruned weights never come back
            prev[c] = mk
            sparsity = 1 - float(mk[~bias].float().mean())
            # p = 0.5: density 1 → 0.5 → 0.4 (the target 0.6 caps the second prune)
            assert sparsity == pytest.approx(0.5 if times[c] == 1 else 0.6, abs=0.01), (c, times[c])
    assert max(times.values()) >= 3 and len(step.table) == len(times)
    assert 0 <= last["step_personal_accuracy"] <= 1 and 0 <= last["step_personal_global_accuracy"] <= 1
    assert 0.5 <= last["step_sparsity"] <= 0.6


# ---- the engine hooks they use -----------------------------------------------------------------
def test_per_client_start_mask_and_hook_agree_across_engine_paths():
    torch.manual_seed(0)
    model = build_model("mlp", in_features=64, hidden=16)
    tr = Trainer(model, "multiclass", LocalTraining(steps=3, batch_size=4, lr=0.2))
    n, k = tr.flat.n, 5
    x, y = torch.randn(60, 1, 8, 8), torch.randint(0, 10, (60,))
    batches = torch.randint(0, 60, (k, 3, 4))
    w = tr.flat.flatten(model)
    start = w + 0.01 * torch.randn(k, n)
    mask = torch.rand(k, n) < 0.7
    offset = torch.randn(k, n) * 0.1
    calls = []

    def hook(t, rows, xb, yb, params, grads):
        calls.append((t, rows.start, rows.stop))
        for name, g in grads.items():
            g.add_(tr.flat.views(offset)[name][rows])

    full = tr.train(start, x, y, batches, mask, grad_hook=hook)
    seq = tr.train_sequential(start, x, y, batches, mask, grad_hook=hook)
    tr.max_cohort = 2
    chunked = tr.train(start, x, y, batches, mask, grad_hook=hook)
    torch.testing.assert_close(seq, full, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-7)
    assert not full[~mask].any()  # masked coordinates stay at each client's own start
    assert (0, 0, 5) in calls and (0, 4, 5) in calls and (2, 2, 4) in calls
    # one client alone, by hand
    theta = start[3].clone()
    for t in range(3):
        p = theta.clone().requires_grad_(True)
        out = functional_call(model, tr.flat.views(p), (x[batches[3, t]],))
        (g,) = torch.autograd.grad(F.cross_entropy(out, y[batches[3, t]]), p)
        theta = theta - 0.2 * (g + offset[3]) * mask[3]
    torch.testing.assert_close(full[3], theta - start[3], rtol=1e-5, atol=1e-7)


# ---- bad options --------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme, opts, name", [
    ("fedprox", {"mu": -1.0}, "mu"),
    ("fedprox", {"mu": 10.0}, "mu"),  # lr·mu ≥ 2: local SGD diverges
    ("fedprox", {"mu": "big"}, "mu"),
    ("feddyn", {"alpha": 0.0}, "alpha"),
    ("feddyn", {"alpha": float("nan")}, "alpha"),
    ("feddyn", {"state_dtype": "int8"}, "state_dtype"),
    ("fsvrg", {"h": 0}, "h"),
    ("fsvrg", {"batch_size": 0}, "batch_size"),
    ("fsvrg", {"batch_size": 1.5}, "batch_size"),
    ("sub-fedavg", {"sparsity": 1.0}, "sparsity"),
    ("sub-fedavg", {"sparsity": -0.1}, "sparsity"),
    ("sub-fedavg", {"prune_rate": 0.0}, "prune_rate"),
    ("sub-fedavg", {"personal_eval": -1}, "personal_eval"),
    ("feddyn", {"beta": 1.0}, "beta"),
])
def test_bad_options_are_config_errors_naming_the_option(scheme, opts, name):
    with pytest.raises(ConfigError, match=rf"\b{name}\b"):
        _sim(scheme, **opts)


def test_flower_deployment_builds_every_fl_variant():
    pytest.importorskip("flwr")
    from dpfl.flower.node import build_run_scheme

    # clients keep their memory / mask on their nodes; FSVRG's full gradient is a first exchange
    for name in ("fedprox", "fsvrg", "feddyn", "sub-fedavg"):
        assert build_run_scheme(_cfg(name), 10).name == name
