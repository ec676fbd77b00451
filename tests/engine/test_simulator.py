"""Simulator: determinism, resume, byte accounting, selection, config errors, CLI."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpfl.config import load_config
from dpfl.engine.simulator import Simulator, simulate
from dpfl.errors import ConfigError
from dpfl.run.state import Run
from dpfl.schemes.sampling import drop, local_positions, select_fixed, select_poisson

TIME_KEYS = ("train_seconds", "eval_seconds", "round_seconds")


def metrics(run_dir):
    out = []
    for ln in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(ln)
        for k in TIME_KEYS:
            m.pop(k, None)
        out.append(m)
    return out


def test_same_seed_same_metrics_and_model(tmp_path, tiny_config):
    a = Run(tiny_config(), tmp_path / "a", log=lambda s: None)
    simulate(a)
    b = Run(tiny_config(), tmp_path / "b", log=lambda s: None)
    simulate(b)
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    assert torch.equal(a.w, b.w)
    c = Run(tiny_config(seed=4), tmp_path / "c", log=lambda s: None)
    simulate(c)
    assert not torch.equal(a.w, c.w)


def test_resume_is_bit_identical(tmp_path, tiny_config):
    full = Run(tiny_config(**{"federation.rounds": 6}), tmp_path / "full", log=lambda s: None)
    simulate(full)

    class Crash(Exception):
        pass

    def crash_at_5(m):
        if m["round"] == 5:
            raise Crash

    part = Run(tiny_config(**{"federation.rounds": 6}), tmp_path / "part", log=lambda s: None)
    with pytest.raises(Crash):
        simulate(part, crash_at_5)  # checkpoint at round 4, metrics written through round 5
    assert len(metrics(tmp_path / "part")) == 5
    resumed = Run.resume(tmp_path / "part", log=lambda s: None)
    assert resumed.round == 4
    simulate(resumed)
    assert metrics(tmp_path / "part") == metrics(tmp_path / "full")
    assert torch.equal(resumed.w, full.w)


def test_the_summary_names_the_code_that_ran_each_part_of_a_resumed_run(tmp_path, tiny_config, monkeypatch):
    """summary.json's `code` lists the dpfl version / git commit that ran the rounds, one entry per
    version: a resume by the same code adds none, one by other code adds one from its first round."""
    import subprocess

    import dpfl
    from dpfl.errors import DataError
    from dpfl.run import checkpoint as ckpt
    from dpfl.run import state  # the run's bookkeeping: code versions, where it ran

    cfg = tiny_config(**{"federation.rounds": 4, "run.checkpoint_every": 2})
    full = Run(cfg, tmp_path / "full", log=lambda s: None)
    simulate(full)
    code = json.loads((tmp_path / "full" / "summary.json").read_text())["code"]
    here = state.ran_on(state.torch.device("cpu"))
    assert code == [{**state.code_version(), "ran_on": here, "from_round": 1}] and code[0]["dpfl"] == dpfl.__version__
    assert here.startswith("cpu: ")
    root = state.Path(dpfl.__file__).resolve().parent.parent
    if (root / ".git").exists():
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
        assert code[0]["commit"] == head.stdout.strip() and isinstance(code[0]["modified"], bool)

    def stop_at_3(m):
        if m["round"] == 3:
            raise KeyboardInterrupt

    other = {"dpfl": "9.9", "commit": "f" * 40, "modified": False}
    for name, version, at in (("same", state.code_version(), here), ("other", other, here),
                              ("elsewhere", state.code_version(), "cuda: a GPU on a CPU (AVX512)")):
        with pytest.raises(KeyboardInterrupt):
            simulate(Run(cfg, tmp_path / name, log=lambda s: None), stop_at_3)  # checkpoint at round 2
        monkeypatch.setattr(state, "code_version", lambda v=version: dict(v))
        monkeypatch.setattr(state, "ran_on", lambda d, at=at: at)
        simulate(Run.resume(tmp_path / name, log=lambda s: None))
        monkeypatch.undo()
        got = json.loads((tmp_path / name / "summary.json").read_text())["code"]
        want = code if name == "same" else [*code, {**version, "ran_on": at, "from_round": 3}]
        assert got == want, name
        assert metrics(tmp_path / name) == metrics(tmp_path / "full")

    st = ckpt.load(tmp_path / "full" / "checkpoint.pt")
    st["code"] = [{"dpfl": "0.1.0", "commit": 7}]
    ckpt.save(st, tmp_path / "full" / "checkpoint.pt")
    with pytest.raises(DataError, match="'code' must be a list of code versions"):
        Run.resume(tmp_path / "full", log=lambda s: None, rounds=5)
    del st["code"]  # a checkpoint from before code versions: its rounds' code is unknown
    ckpt.save(st, tmp_path / "full" / "checkpoint.pt")
    sim = Run.resume(tmp_path / "full", log=lambda s: None, rounds=5)
    assert sim.code == [{"dpfl": None, "commit": None, "modified": None, "from_round": 1},
                        {**state.code_version(), "ran_on": here, "from_round": 5}]
    st["code"] = [{**state.code_version(), "ran_on": 3, "from_round": 1}]  # not a line of text
    ckpt.save(st, tmp_path / "full" / "checkpoint.pt")
    with pytest.raises(DataError, match="'code' must be a list of code versions"):
        Run.resume(tmp_path / "full", log=lambda s: None, rounds=5)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_round_saves_a_checkpoint_and_resume_equals_an_uninterrupted_run(
        tmp_path, tiny_config, signame):
    import os
    import signal

    from dpfl.errors import RunStopped

    full = Run(tiny_config(**{"federation.rounds": 6}), tmp_path / "full", log=lambda s: None)
    simulate(full)

    def signal_in_round_3(m):
        if m["round"] == 3:
            os.kill(os.getpid(), getattr(signal, signame))

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    part = Run(tiny_config(**{"federation.rounds": 6}), tmp_path / "part", log=lambda s: None)
    with pytest.raises(RunStopped, match=f"stopped by {signame} after round 3 of 6; checkpoint saved; resume with"):
        simulate(part, signal_in_round_3)  # checkpoint_every = 2: without the signal the checkpoint would be at 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert len(metrics(tmp_path / "part")) == 3 and not (tmp_path / "part" / "summary.json").exists()
    resumed = Run.resume(tmp_path / "part", log=lambda s: None)
    assert resumed.round == 3
    simulate(resumed)
    assert metrics(tmp_path / "part") == metrics(tmp_path / "full")
    assert torch.equal(resumed.w, full.w)


def test_cli_run_stopped_by_sigterm_exits_130_with_the_resume_command(tmp_path, tiny_config):
    import os
    import signal
    import subprocess
    import sys
    import time

    from dpfl.config import dump_config

    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_config(tiny_config(**{"federation.rounds": 10_000, "run.checkpoint_every": 10_000})))
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "dpfl.cli.main", "run", str(cfg), "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.poll() is not None else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    text = p.communicate(timeout=120)[0]
    assert p.returncode == 130, text
    done = len(metrics(out))
    assert f"stopped by SIGTERM after round {done} of 10000; checkpoint saved; resume with `dpfl run --resume" in text
    assert "error" not in text.lower()
    assert Run.resume(out, log=lambda s: None).round == done


def test_a_model_built_for_other_inputs_is_one_config_error_before_anything_is_written(tmp_path, tiny_config):
    cfg = tiny_config(**{"model.options": {"in_features": 784, "hidden": 8}})  # digits examples are 8x8
    with pytest.raises(ConfigError, match=r"model 'mlp' does not take the examples of .*\(shape \(1, 8, 8\)\)"):
        Run(cfg, tmp_path / "run", log=lambda s: None)
    assert not (tmp_path / "run").exists()


def test_fl_std_bytes_measured_equal_formula(tmp_path, tiny_config):
    sim = Run(tiny_config(), tmp_path, log=lambda s: None)
    simulate(sim)
    ms = metrics(tmp_path)
    n, k, N = sim.flat.n, 5, 20
    for m in ms:
        assert m["up_bytes"] == k * n * 4 and m["down_bytes"] == k * n * 4
    last = ms[-1]
    assert last["cum_up_bytes_per_client"] == pytest.approx(4 * n * 4 * k / N)
    assert last["formula_up_bytes_per_client"] == pytest.approx(last["cum_up_bytes_per_client"])


def test_weighted_mean_uses_data_sizes(tmp_path, tiny_config):
    cfg = tiny_config(**{"data.partition": "quantity", "federation.rounds": 1})
    sim = Run(cfg, None, log=lambda s: None)
    sim.setup()
    w0 = sim.w.clone()
    cohort, _ = sim.select(1)
    ctx = sim.context(1, cohort, len(cohort))
    u = Simulator(sim).client_updates(ctx)
    sizes = torch.tensor(sim.fed.sizes[cohort], dtype=torch.float64)
    expect = (sizes / sizes.sum()) @ u.double()
    Simulator(sim).step_round()
    torch.testing.assert_close((sim.w - w0).double(), expect, rtol=1e-5, atol=1e-7)


def test_learns_on_digits(tmp_path, tiny_config):
    cfg = tiny_config(**{"federation.rounds": 15, "train.steps": 5, "train.lr": 0.2})
    s = simulate(Run(cfg, tmp_path, log=lambda s: None))
    assert s["best"]["accuracy"] > 0.6  # chance is 0.1


def test_dropout_and_poisson_sampling(tmp_path, tiny_config):
    cfg = tiny_config(**{"federation.dropout": 0.5, "federation.sampling": "poisson", "federation.rounds": 3})
    simulate(Run(cfg, tmp_path, log=lambda s: None))
    ms = metrics(tmp_path)
    assert all(m["answered"] <= m["selected"] for m in ms)
    assert any(m["answered"] < m["selected"] for m in ms)


def test_selection_and_batches():
    rng = np.random.default_rng(0)
    c = select_fixed(100, 10, rng)
    assert len(set(c.tolist())) == 10 and c.max() < 100
    counts = np.mean([len(select_poisson(1000, 0.05, rng)) for _ in range(200)])
    assert abs(counts - 50) < 3
    kept, dropped = drop(np.arange(1000), 0.3, rng)
    assert abs(len(dropped) - 300) < 60 and len(kept) + len(dropped) == 1000
    pos = local_positions(np.array([10, 3]), steps=2, batch=5, rng=rng)
    assert sorted(pos[0].ravel().tolist()) == list(range(10))  # one epoch without replacement
    assert pos[1].max() < 3
    with pytest.raises(ValueError):
        select_fixed(5, 6, rng)


def test_config_errors_name_key_and_allowed(tmp_path, tiny_config):
    with pytest.raises(ConfigError, match=r"federation.roundz.*allowed keys here: .*rounds"):
        load_config(data={"federation": {"roundz": 3}})
    with pytest.raises(ConfigError, match=r"train.optimizer"):
        load_config(data={"train": {"optimizer": "rmsprop"}})
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"unknown scheme 'fl-nope'; allowed: .*fl-std"):
        Run(tiny_config(**{"scheme.name": "fl-nope"}), None, log=lambda s: None)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['gamma'\]"):
        Run(tiny_config(**{"scheme.options": {"gamma": 1}}), None, log=lambda s: None)
    with pytest.raises(ConfigError, match="not a resumable run directory"):
        Run.resume(tmp_path)


def test_cli_run_resume_report(tmp_path, tiny_config):
    from dpfl.cli.main import app

    cfg = tmp_path / "c.toml"
    from dpfl.config import dump_config

    cfg.write_text(dump_config(tiny_config(**{"federation.rounds": 2})))
    r = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "run"), "--set", "federation.rounds=3"])
    assert r.exit_code == 0, r.output
    assert "best accuracy" in r.output
    assert len(metrics(tmp_path / "run")) == 3
    r = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "run"), "--rounds", "4"])
    assert r.exit_code == 0, r.output
    assert len(metrics(tmp_path / "run")) == 4
    r = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plots" / "accuracy_vs_round.png").stat().st_size > 1000
    r = CliRunner().invoke(app, ["run", str(cfg), "--set", "federation.rounds=0"])
    assert r.exit_code == 2 and "federation.rounds" in r.output


class _Diverging:
    """A `Simulator` wrap: local training where the chosen rows of round 2 come back non-finite."""

    bad_rows: tuple = (1,)

    def __call__(self, train):
        def updates(ctx, batches, seed):
            u = train(ctx, batches, seed)
            self.last_u, self.last_weights = u.clone(), ctx.weights.clone()
            if ctx.round == 2:
                u = u.clone()
                u[list(self.bad_rows), 3] = float("nan")
                u[list(self.bad_rows), 5] = float("inf")
            return u

        return updates


@pytest.mark.parametrize("scheme", ["fl-std", "fl-sign"])
def test_client_with_nonfinite_update_drops_out_and_the_round_goes_on(tmp_path, tiny_config, scheme):
    sim = Run(tiny_config(**{"scheme.name": scheme, "federation.rounds": 3}), tmp_path, log=lambda s: None)
    div = _Diverging()
    drive = Simulator(sim, wrap=div)
    drive.step_round()
    w1 = sim.w.clone()
    m = drive.step_round()
    assert m["diverged"] == 1 and m["answered"] == 4 and m["selected"] == 5
    assert "aborted" not in m and torch.isfinite(sim.w).all()
    keep = [0, 2, 3, 4]
    if scheme == "fl-std":  # the weighted mean of the four other clients' updates
        u, wts = div.last_u[keep].double(), div.last_weights[keep].double()
        expected = (wts[:, None] * u).sum(0) / wts.sum()
        assert torch.allclose((sim.w - w1).double(), expected, atol=1e-6)
        assert m["up_bytes"] == 4 * sim.flat.n * 4
    assert "diverged" not in drive.step_round()


def test_round_with_only_nonfinite_updates_is_aborted(tmp_path, tiny_config):
    sim = Run(tiny_config(**{"federation.rounds": 2}), tmp_path, log=lambda s: None)
    div = _Diverging()
    div.bad_rows = (0, 1, 2, 3, 4)
    drive = Simulator(sim, wrap=div)
    drive.step_round()
    w1 = sim.w.clone()
    m = drive.step_round()
    assert m["diverged"] == 5 and m["answered"] == 0 and "non-finite" in m["aborted"]
    assert torch.equal(sim.w, w1) and m["up_bytes"] == 0


def test_the_simulator_is_a_driver_only_the_run_holds_state(tmp_path, tiny_config):
    """One run, two drivers: the simulator keeps no state of its own beside the `Run` it drives (which
    the deployed `Coordinator` drives too), and adds none to it."""
    sim = Run(tiny_config(), tmp_path / "sim", log=lambda s: None)
    run = Run(tiny_config(), tmp_path / "run", log=lambda s: None)
    drive = Simulator(sim)
    assert set(vars(drive)) == {"run", "_updates"} and drive.run is sim
    simulate(sim)
    run.setup()
    assert set(vars(sim)) == set(vars(run))


def test_simulate_until_stops_after_that_round(tiny_config):
    run = Run(tiny_config(**{"federation.rounds": 3}), None, log=lambda s: None)
    seen = []
    simulate(run, lambda m: seen.append(m["round"]), until=0)
    assert seen == [] and run.round == 0
    simulate(run, lambda m: seen.append(m["round"]), until=2)
    assert seen == [1, 2] and run.round == 2
