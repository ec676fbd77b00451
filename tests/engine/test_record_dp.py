"""Record-level DP-SGD inside the clients (train.dpsgd): accounting, clipping, determinism, config."""

import functools
import io
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpfl.config import load_config
from dpfl.dpsgd.core import clipped_grad_sum
from dpfl.engine.simulator import Simulator, simulate
from dpfl.errors import BudgetExceededError, ConfigError, PrivacyError
from dpfl.models import build_model
from dpfl.privacy import rdp as R
from dpfl.privacy.record import RecordAccountant
from dpfl.rng import Seeds
from dpfl.run.state import Run
from dpfl.schemes.sampling import poisson_positions
from dpfl.training.trainer import ClientDP, LocalTraining, Trainer

ORDERS = R.DEFAULT_ORDERS[::10]  # fractional and integer orders; dp-accounting is slow per order
DP = {"clip": 1.0, "noise_multiplier": 1.1}


@functools.cache
def _reference(sigma, rates_steps, delta):
    from dp_accounting import dp_event as E
    from dp_accounting.rdp import rdp_privacy_accountant as D

    acc = D.RdpAccountant(orders=list(ORDERS))
    for q, steps in rates_steps:
        acc.compose(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def reference_epsilon(sigma, rates_steps, delta):
    return _reference(sigma, tuple(rates_steps), delta)


def metrics(run_dir):
    out = []
    for ln in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(ln)
        for k in ("train_seconds", "eval_seconds", "round_seconds"):
            m.pop(k, None)
        out.append(m)
    return out


def test_accountant_matches_dp_accounting_per_client():
    acc = RecordAccountant(5, 1.3, orders=ORDERS)
    acc.add([0, 1, 2], [0.1, 0.5, 1.0], 7)
    acc.add([0, 3], [0.1, 0.02], 3)
    acc.add([1], [0.25], 4)  # client 1 at two rates
    eps = acc.epsilon([0, 1, 2, 3, 4], 1e-5)
    want = [reference_epsilon(1.3, [(0.1, 10)], 1e-5), reference_epsilon(1.3, [(0.5, 7), (0.25, 4)], 1e-5),
            reference_epsilon(1.3, [(1.0, 7)], 1e-5), reference_epsilon(1.3, [(0.02, 3)], 1e-5), 0.0]
    assert eps == pytest.approx(want, rel=1e-6)
    assert list(acc.spent()) == [0, 1, 2, 3]
    before = acc.epsilon([3], 1e-5)
    after = acc.epsilon_after([3], [0.02], 5, 1e-5)
    assert after[0] == pytest.approx(reference_epsilon(1.3, [(0.02, 8)], 1e-5), rel=1e-6)
    assert acc.epsilon([3], 1e-5) == before  # epsilon_after records nothing
    st = acc.state_dict()
    other = RecordAccountant(5, 1.3, orders=ORDERS)
    other.load_state_dict(st)
    assert np.array_equal(other.epsilon(range(5), 1e-5), eps)
    with pytest.raises(PrivacyError):
        RecordAccountant(5, 2.0).load_state_dict(st)
    with pytest.raises(PrivacyError):
        acc.add([5], [0.1], 1)


def test_simulation_per_client_epsilon_matches_dp_accounting(tiny_config):
    # quantity partition: clients of different sizes (rates) and participation counts
    cfg = tiny_config(**{"train.dpsgd": DP, "data.partition": "quantity", "federation.rounds": 4,
                         "data.n_clients": 8, "federation.clients_per_round": 3})
    sim = Run(cfg, None, log=lambda s: None)
    sim.setup()
    sim.record.orders = ORDERS
    sim.record._curves.clear()
    ms = [Simulator(sim).step_round() for _ in range(4)]
    rounds: dict[int, int] = {}
    last: dict[int, float] = {}
    for m in ms:
        for c, e in m["record_epsilon_per_client"].items():
            rounds[int(c)] = rounds.get(int(c), 0) + 1
            last[int(c)] = e
    assert len(set(rounds.values())) > 1 and len({int(sim.fed.sizes[c]) for c in rounds}) > 1
    steps = cfg.train.steps
    for c, p in rounds.items():
        q = min(1.0, cfg.train.batch_size / int(sim.fed.sizes[c]))
        assert last[c] == pytest.approx(reference_epsilon(1.1, [(q, p * steps)], 1e-5), rel=1e-6), c
    assert ms[-1]["record_epsilon_max"] == pytest.approx(max(last.values()))
    assert ms[-1]["record_epsilon_median"] == pytest.approx(float(np.median(list(last.values()))))
    assert ms[-1]["record_clients_spent"] == len(rounds)


def test_clipped_sum_with_zero_noise_matches_explicit_per_example_gradients():
    model = build_model("mlp", seed=0, in_features=6, hidden=5, num_classes=3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 6, generator=g) * 3, torch.randint(0, 3, (12,), generator=g)
    batches = torch.tensor([[[0, 1, 2, 3]], [[6, 7, 8, 0]]])  # [k=2, T=1, M=4]
    weight = torch.tensor([[[1.0, 1, 1, 1]], [[1.0, 1, 0, 0]]])  # client 1: two padding rows
    expected = torch.tensor([3.0, 2.5])
    per = {}  # explicit per-example gradients, one autograd call each
    for i in (0, 1, 2, 3, 6, 7):
        m = build_model("mlp", seed=0, in_features=6, hidden=5, num_classes=3)
        F.cross_entropy(m(x[i : i + 1]), y[i : i + 1]).backward()
        per[i] = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    clip, lr = float(torch.stack([v.norm() for v in per.values()]).median()), 0.3
    assert any(v.norm() > clip * 1.01 for v in per.values())  # clipping is active for some
    tr = Trainer(model, "multiclass", LocalTraining(steps=1, batch_size=4, lr=lr))
    w = tr.flat.flatten(model)
    u = tr.train(w, x, y, batches, dp=ClientDP(clip, 0.0, weight, expected, [None, None]))
    for c, rows in ((0, (0, 1, 2, 3)), (1, (6, 7))):
        c_eff = clip * (1 - 2.0**-12)  # dpsgd.core clips to C(1 − 2⁻¹²): rounding never exceeds C
        total = sum(per[i] * min(1.0, c_eff / float(per[i].norm())) for i in rows)
        assert torch.allclose(u[c], -lr * total / expected[c], atol=1e-6, rtol=1e-4)


def _tiny_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(3, 4, 3, stride=2, bias=False), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)).double()


def test_cohort_bookkeeping_noised_update_matches_a_per_example_reference():
    """The cohort's DP-SGD step (book-keeping, all clients at once) against one autograd call per
    example: clip each to C(1 − 2⁻¹²), sum the unpadded ones, add N(0, σ²C²) from the client's own
    stream (pate.noise.gaussian on a fresh copy of it), divide by q·n; 3 clients, 2 steps."""
    from dpfl.pate.noise import gaussian

    model = _tiny_cnn()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 1, 8, 8, generator=g, dtype=torch.float64) * 2, torch.randint(0, 3, (30,), generator=g)
    batches = torch.tensor([[[0, 1, 2, 3], [4, 5, 0, 0]], [[10, 11, 12, 0], [13, 14, 15, 16]],
                            [[20, 0, 0, 0], [21, 22, 23, 24]]])  # [k=3, T=2, M=4]
    weight = torch.tensor([[[1.0, 1, 1, 1], [1, 1, 0, 0]], [[1, 1, 1, 0], [1, 1, 1, 1]],
                           [[1, 0, 0, 0], [1, 1, 1, 1]]], dtype=torch.float64)
    expected, clip, sigma, lr = torch.tensor([3.0, 2.5, 2.0], dtype=torch.float64), 0.5, 0.8, 0.3
    tr = Trainer(model, "multiclass", LocalTraining(steps=2, batch_size=4, lr=lr))
    assert tr.cohort.bookkeeping_rows(4) > 0
    w = tr.flat.flatten(model).double()
    u = tr.train(w, x, y, batches, dp=ClientDP(clip, sigma, weight, expected,
                                               [Seeds(4).crypto("n", c) for c in range(3)]))
    c_eff = clip * (1 - 2.0**-12)
    for c in range(3):
        wc, rng = w.clone(), Seeds(4).crypto("n", c)
        for t in range(2):
            total = torch.zeros_like(wc)
            for j in range(4):
                if weight[c, t, j]:
                    m = _tiny_cnn()
                    torch.nn.utils.vector_to_parameters(wc, m.parameters())
                    i = int(batches[c, t, j])
                    F.cross_entropy(m(x[i:i + 1]), y[i:i + 1]).backward()
                    gi = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
                    total += gi * min(1.0, c_eff / float(gi.norm()))
            noise = torch.from_numpy(gaussian(rng, wc.numel(), sigma * clip))
            wc = wc - lr * (total + noise) / expected[c]
        assert torch.allclose(u[c], wc - w, rtol=1e-9, atol=1e-12), c
    assert any(abs(float(t)) > 0 for t in u[0])


def test_cohort_bookkeeping_equals_the_vmap_path_and_falls_back():
    """Without noise, the cohort book-keeping sums equal the per-example vmap path (float64), and a
    model it cannot take (a module run twice) goes to that path with the same result."""
    model = _tiny_cnn()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(4, 5, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (4, 5), generator=g)
    wt = (torch.rand(4, 5, generator=g) < 0.7).double()
    tr = Trainer(model, "multiclass", LocalTraining())
    params = {n: v.expand(4, *v.shape).clone() for n, v in tr.flat.views(tr.flat.flatten(model).double()).items()}
    got = tr.cohort.clipped_sums(params, x, y, 0.3, wt)
    for c in range(4):
        ref = clipped_grad_sum({n: v[c] for n, v in params.items()}, {}, model, x[c], y[c], clip=0.3, mask=wt[c])
        for n in ref:
            assert torch.allclose(got[n][c], ref[n], rtol=1e-10, atol=1e-13), (c, n)

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(5, 5), torch.nn.Linear(5, 3)

        def forward(self, x):
            return self.b(self.a(self.a(x)))

    torch.manual_seed(0)
    tw = Trainer(Twice().double(), "multiclass", LocalTraining())
    p = {n: v.expand(2, *v.shape).clone() for n, v in tw.flat.views(tw.flat.flatten(tw.model).double()).items()}
    xt, yt = torch.randn(2, 3, 5, dtype=torch.float64), torch.tensor([[0, 1, 2], [2, 2, 1]])
    assert tw.cohort.bookkeeping_rows(3) > 0 and tw.cohort.clipped_sums(p, xt, yt, 0.2, torch.ones(2, 3)) is None
    dp = ClientDP(0.2, 0.0, torch.ones(2, 1, 3, dtype=torch.float64), torch.tensor([3.0, 3.0]), [None, None])
    got = tw._dp_grads(p, xt, yt, dp, 0, None)
    for c in range(2):
        ref = clipped_grad_sum({n: v[c] for n, v in p.items()}, {}, tw.model, xt[c], yt[c], clip=0.2)
        assert all(torch.allclose(got[n][c], ref[n] / 3.0, rtol=1e-12) for n in ref)


def test_same_seed_identical_and_resume(tmp_path, tiny_config):
    cfg = {"train.dpsgd": DP, "federation.rounds": 4}
    a = Run(tiny_config(**cfg), tmp_path / "a", log=lambda s: None)
    simulate(a)
    b = Run(tiny_config(**cfg), tmp_path / "b", log=lambda s: None)
    simulate(b, lambda m: None)
    assert torch.equal(a.w, b.w) and metrics(tmp_path / "a") == metrics(tmp_path / "b")
    plain = Run(tiny_config(**{"federation.rounds": 4}), None, log=lambda s: None)
    simulate(plain)
    assert not torch.equal(plain.w, a.w)

    class Crash(Exception):
        pass

    def crash_at_3(m):
        if m["round"] == 3:
            raise Crash

    c = Run(tiny_config(**cfg), tmp_path / "c", log=lambda s: None)
    with pytest.raises(Crash):
        simulate(c, crash_at_3)  # checkpoint at round 2
    resumed = Run.resume(tmp_path / "c", log=lambda s: None)
    assert resumed.round == 2
    simulate(resumed)
    assert torch.equal(resumed.w, a.w) and metrics(tmp_path / "c") == metrics(tmp_path / "a")


def test_sequential_engine_matches_vectorized(tiny_config):
    a = Run(tiny_config(**{"train.dpsgd": DP, "federation.rounds": 2}), None, log=lambda s: None)
    simulate(a)
    b = Run(tiny_config(**{"train.dpsgd": DP, "federation.rounds": 2, "run.engine": "sequential"}), None,
                   log=lambda s: None)
    simulate(b)
    assert torch.allclose(a.w, b.w, atol=1e-5)


def test_target_epsilon_stops_before_exceeding(tmp_path, tiny_config):
    cfg = tiny_config(**{"train.dpsgd": {**DP, "target_epsilon": 3.0}, "federation.rounds": 20,
                         "federation.clients_per_round": 10})
    sim = Run(cfg, tmp_path, log=lambda s: None)
    summary = simulate(sim)
    ms = metrics(tmp_path)
    assert summary["stopped"] and "train.dpsgd.target_epsilon" in summary["stopped"]
    assert 0 < len(ms) < 20 and all(m["record_epsilon_max"] <= 3.0 for m in ms)
    with pytest.raises(BudgetExceededError):
        Simulator(sim).step_round()


def test_target_only_calibrates_sigma_within_target(tiny_config):
    cfg = tiny_config(**{"train.dpsgd": {"clip": 1.0, "target_epsilon": 2.0}, "federation.rounds": 6})
    sim = Run(cfg, None, log=lambda s: None)
    s = simulate(sim)
    assert s["stopped"] is None and s["rounds_run"] == 6
    assert 1.5 < s["record_level"]["epsilon_max"] <= 2.0


def test_poisson_positions_rates_and_padding():
    rngs = [Seeds(0).crypto("t", c) for c in range(3)]
    pos, weight, q = poisson_positions(np.array([4, 40, 400]), 200, 8, rngs)
    assert list(q) == [1.0, 0.2, 0.02]
    assert (weight[0].sum(1) == 4).all()  # q = 1: every record every step
    assert abs(weight[1].sum() / 200 - 8) < 1 and abs(weight[2].sum() / 200 - 8) < 1
    assert (pos[weight == 0] == 0).all() and pos.max() < 400


@pytest.mark.parametrize("dpsgd, needle", [
    ({"clip": 1.0}, "give train.dpsgd.noise_multiplier or train.dpsgd.target_epsilon"),
    ({"clip": -1.0, "noise_multiplier": 1.0}, "train.dpsgd.clip"),
    ({"noise_multiplier": 0.0}, "train.dpsgd.noise_multiplier"),
    ({"noise_multiplier": 1.0, "sampling": "shuffle"}, "train.dpsgd.sampling"),
])
def test_config_errors_are_one_line(dpsgd, needle, tiny_config):
    with pytest.raises(ConfigError) as e:
        tiny_config(**{"train.dpsgd": dpsgd})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_full_batch_scheme_refused(tiny_config):
    with pytest.raises(ConfigError, match="train.dpsgd does not combine"):
        Run(tiny_config(**{"train.dpsgd": DP, "scheme.name": "fedsgd"}), None, log=lambda s: None)


def test_load_config_accepts_section():
    cfg = load_config(data={"train": {"dpsgd": {"target_epsilon": 4.0}}})
    assert cfg.train.dpsgd.clip == 1.0 and cfg.train.dpsgd.noise_multiplier is None


def test_record_epsilon_beside_client_level_epsilon(tiny_config):
    cfg = tiny_config(**{"train.dpsgd": DP, "federation.rounds": 2, "scheme.name": "fl-std-dp",
                         "scheme.options": {"sigma": 1.0, "clip": 1.0}})
    sim = Run(cfg, None, log=lambda s: None)
    m = [Simulator(sim).step_round() for _ in range(2)][-1]
    assert m["epsilon"] > 0 and m["record_epsilon_max"] > 0
    assert sim.summary()["epsilon_final"] == m["epsilon"]
    assert sim.summary()["record_level"]["epsilon_max"] == m["record_epsilon_max"]


def test_accountant_rdp_and_bad_state():
    acc = RecordAccountant(3, 1.0, orders=ORDERS)
    acc.add([0, 2], [0.5, 1.0], 2)
    r = acc.rdp([0, 1, 2])
    assert np.array_equal(r[1], np.zeros(ORDERS.size))
    assert np.allclose(r[2], 2 * R.sampled_gaussian_rdp(1.0, 1.0, ORDERS))
    st = acc.state_dict()
    with pytest.raises(PrivacyError):
        RecordAccountant(3, 1.0).load_state_dict({**st, "steps": st["steps"] * 0})
    with pytest.raises(PrivacyError):
        RecordAccountant(2, 1.0).load_state_dict(st)  # client 2 does not exist there


def test_gradient_correction_scheme_refused(tiny_config):
    sim = Run(tiny_config(**{"train.dpsgd": DP, "scheme.name": "feddyn", "scheme.options": {"alpha": 0.01}}),
                     None, log=lambda s: None)
    with pytest.raises(ConfigError, match="train.dpsgd does not combine"):
        Simulator(sim).step_round()


def test_record_fl_bench_runs_both_sides_and_they_account_alike(tmp_path):
    """`dpfl bench record-fl` on a tiny federation: both sides train the same clients, and Opacus's RDP
    accountant gives the ε that dpfl's per-client accountant gives (same q, σ, steps)."""
    pytest.importorskip("opacus")
    from rich.console import Console

    from dpfl.bench.record_fl import run_bench

    cfg = tmp_path / "tiny.toml"
    cfg.write_text('name = "tiny"\nseed = 3\n[data]\ndataset = "digits"\nn_clients = 20\npartition = "shards"\n'
                   '[model]\nname = "mlp"\noptions = {in_features = 64, hidden = 16, num_classes = 10}\n'
                   '[train]\nsteps = 2\nbatch_size = 8\nlr = 0.1\n[federation]\nrounds = 1\nclients_per_round = 4\n')
    console = Console(file=io.StringIO(), width=200)
    out = run_bench(rounds=2, clients=4, noise_multiplier=1.3, config=str(cfg), console=console)
    assert [r["clients"] for r in out["per_round"]] == [4, 4]
    assert out["dpfl"]["examples_per_s"] > 0 and out["opacus"]["examples_per_s"] > 0
    assert 0 <= out["opacus"]["accuracy"] <= 1 and 0 <= out["dpfl"]["accuracy"] <= 1
    for key in ("record_epsilon_max", "record_epsilon_median"):
        assert out["opacus"][key] == pytest.approx(out["dpfl"][key], rel=0.02), key
    assert "dpfl / Opacus examples per second" in console.file.getvalue()


@pytest.mark.parametrize("eps", [1, 4, 8])
def test_record_dp_configs_are_setting_d_with_a_record_level_target(eps):
    from dpfl.experiments.reproduce import configs_root

    got = load_config(configs_root() / "record-dp" / f"setting-d-eps{eps}.toml").model_dump()
    base = load_config(configs_root() / "settings" / "setting-d-fl-std.toml").model_dump()
    dp = got["train"].pop("dpsgd")
    assert dp["target_epsilon"] == eps and dp["delta"] == 1e-5 and dp["noise_multiplier"] is None
    base["train"].pop("dpsgd")
    for key in ("name",):
        got.pop(key), base.pop(key)
    got["eval"].pop("every"), base["eval"].pop("every"), got["run"].pop("threads"), base["run"].pop("threads")
    assert got == base


def test_noise_drawn_in_threads_is_the_noise_drawn_in_one(tiny_config):
    # each client's DP-SGD noise comes from its own stream: drawing rows in run.threads threads
    # changes the wall time only (the tiny model's kernels are too small to split across threads)
    runs = []
    for threads in (1, 3):
        sim = Run(tiny_config(**{"train.dpsgd": DP, "federation.rounds": 2, "run.threads": threads}), None,
                         log=lambda s: None)
        simulate(sim)
        runs.append(sim.w.clone())
    assert torch.equal(*runs)


def test_record_fl_bench_says_so_when_the_budget_stops_it_before_its_first_round(tmp_path):
    pytest.importorskip("opacus")
    from rich.console import Console

    from dpfl.bench.record_fl import run_bench
    from dpfl.errors import BudgetExceededError

    cfg = tmp_path / "tiny.toml"
    cfg.write_text('name = "tiny"\nseed = 3\n[data]\ndataset = "digits"\nn_clients = 20\npartition = "shards"\n'
                   '[model]\nname = "mlp"\noptions = {in_features = 64, hidden = 16, num_classes = 10}\n'
                   '[train]\nsteps = 2\nbatch_size = 8\nlr = 0.1\n[train.dpsgd]\ntarget_epsilon = 0.01\n'
                   '[federation]\nrounds = 1\nclients_per_round = 4\n')
    with pytest.raises(BudgetExceededError, match="no round to compare: round 1 would exceed "
                                                  "train.dpsgd.target_epsilon = 0.01"):
        run_bench(rounds=2, clients=4, noise_multiplier=1.3, config=str(cfg), console=Console(file=io.StringIO()))
