from types import SimpleNamespace

import numpy as np
import pytest
import torch
from attack_helpers import tiny_config

from dpfl.attacks.backdoor import predict
from dpfl.engine.simulator import Simulator
from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds
from dpfl.run.state import Run, build_federation


def sim_with(attack, **kw):
    return Run(tiny_config(attack=attack, **kw), None, log=lambda s: None)


def test_in_backdoor_relabels_only_the_attackers_copy():
    sim = sim_with({"name": "in-backdoor", "fraction": 0.2, "options": {"source": 5, "target": 7}})
    original = build_federation(sim.cfg, Seeds(sim.cfg.seed))
    y, y_adv = sim.fed.y, sim.attack.labels(sim)
    assert torch.equal(y, original.y)  # honest clients keep the true labels
    assert (y_adv[y == 5] == 7).all() and torch.equal(y_adv[y != 5], y[y != 5])
    assert all(np.array_equal(a, b) for a, b in zip(sim.fed.clients, original.clients))
    assert torch.equal(sim.attack._x_source, original.x_test[original.y_test == 5])


def test_out_backdoor_removes_the_class_from_honest_clients_and_the_test_set():
    opts = {"source": 0, "target": 1, "drop": [9]}
    sim = sim_with({"name": "out-backdoor", "fraction": 0.2, "options": opts})
    original = build_federation(sim.cfg, Seeds(sim.cfg.seed))
    y = original.y.numpy()
    for c, (kept, before) in enumerate(zip(sim.fed.clients, original.clients)):
        assert not np.isin(y[kept], [0, 9]).any()  # no honest client holds class 0 (or dropped 9)
        assert np.array_equal(kept, before[~np.isin(y[before], [0, 9])])
        assert np.array_equal(sim.attack._aux[c], before[y[before] == 0])  # an attacker brings its 0s
        pool = sim.attack.attacker_indices(sim, c)
        assert set(pool.tolist()) == set(before[y[before] != 9].tolist())
    assert (sim.attack.labels(sim)[torch.from_numpy(original.y.numpy() == 0)] == 1).all()
    assert not torch.isin(sim.fed.y_test, torch.tensor([0, 9])).any()
    assert len(sim.fed.y_test) == int((~torch.isin(original.y_test, torch.tensor([0, 9]))).sum())
    assert torch.equal(sim.attack._x_source, original.x_test[original.y_test == 0])
    assert np.array_equal(sim.fed.sizes, [len(c) for c in sim.fed.clients])


def test_backdoor_metrics_match_a_direct_count():
    sim = sim_with({"name": "in-backdoor", "fraction": 0.2, "options": {"source": 5, "target": 7}})
    m = Simulator(sim).step_round()
    pred = predict(sim.model, sim.fed.x_test[sim.fed.y_test == 5])
    assert m["source_accuracy"] == pytest.approx(float((pred == 5).double().mean()))
    assert m["attack_success"] == pytest.approx(float((pred == 7).double().mean()))


def test_out_backdoor_with_boosting_implants_the_backdoor_in_fl_std():
    def run(fraction):
        sim = sim_with({"name": "out-backdoor", "fraction": fraction, "options": {"source": 0, "target": 1,
                                                                                  "boost": 3.0}}, rounds=6)
        ms = [Simulator(sim).step_round() for _ in range(6)]
        return np.mean([m["attack_success"] for m in ms]), max(m["accuracy"] for m in ms)

    (clean, _), (attacked, acc) = run(0.0), run(0.3)
    assert attacked > clean + 0.3  # FL-STD oscillates on the backdoor (thesis §6.2.2) but carries it
    assert acc > 0.5  # while the global task still learns: the attack hides


def test_backdoor_errors_are_named():
    with pytest.raises(ConfigError, match=r"out of range; allowed 0..9"):
        sim_with({"name": "in-backdoor", "fraction": 0.1, "options": {"source": 5, "target": 12}})
    a = sim_with({"name": "in-backdoor", "fraction": 0.1, "options": {"source": 0, "target": 1}}).attack
    with pytest.raises(ConfigError, match="multiclass"):
        a.prepare(SimpleNamespace(task="binary", num_classes=2), None)
    with pytest.raises(DataError, match="without data"):
        sim_with({"name": "out-backdoor", "fraction": 0.1, "options": {"source": 0, "target": 1}},
                 data={"partition": "classes", "partition_options": {"classes_per_client": 1}})


def test_pool_epochs_trains_the_union_for_a_clients_epochs_not_its_steps(monkeypatch):
    """Default: the colluders' union trains T_gd steps, as one client. pool_epochs: T_gd steps per
    colluder, so the union gets as many passes as each client's T_gd steps make over its own data."""
    def one_row_calls(pool_epochs):
        opts = {"source": 5, "target": 7, "pool_epochs": pool_epochs}
        sim = sim_with({"name": "in-backdoor", "fraction": 0.3, "options": opts})
        real, seen = sim.trainer.train, []

        def spy(w, x, y, batches, *a, **kw):
            seen.append(tuple(batches.shape))
            return real(w, x, y, batches, *a, **kw)

        monkeypatch.setattr(sim.trainer, "train", spy)
        Simulator(sim).step_round()
        return [s for s in seen if s[0] == 1]  # the union's one training call (honest: all rows at once)

    assert one_row_calls(False) == [(1, 5, 10)]
    assert one_row_calls(True) == [(1, 5 * 3, 10)]  # fixed mode: 3 colluders of a 10-client cohort


def test_pool_epochs_is_checked():
    with pytest.raises(ConfigError, match="pool_epochs must be true or false"):
        sim_with({"name": "gradient-ascent", "fraction": 0.2, "options": {"pool_epochs": "yes"}})
    sim = sim_with({"name": "gradient-ascent", "fraction": 0.3, "options": {"pool_epochs": True}}, scheme="fedsgd")
    assert sim.scheme.full_batch
    with pytest.raises(ConfigError, match="pool_epochs applies to schemes that train T_gd steps"):
        Simulator(sim).step_round()
