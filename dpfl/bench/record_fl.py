"""`dpfl bench record-fl`: record-level DP-SGD inside the clients of setting D (thesis CNN, Fashion-MNIST,
|D_k| = 10, 5 local steps, batch 10, FL-STD), dpfl's cohort engine (`train.dpsgd`) against the per-client
Opacus loop of Flower's Opacus example (a fresh model copy and `PrivacyEngine.make_private` for every
selected client, local DP-SGD, the data-size-weighted mean of the updates).

Both sides start from the same weights, train the same clients each round (the simulator's selection),
with the same clipping norm, noise multiplier, learning rate, steps and Poisson rate q_k = min(1, B/n_k),
and account each client's record-level ε with RDP. dpfl draws its noise from per-client CryptoRNG
streams, Opacus from torch's generator. Rounds are interleaved (dpfl round r, then Opacus round r) so
that load changes on a shared machine hit both; every number printed is measured here.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
import warnings

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from dpfl.config import load_config
from dpfl.engine.simulator import simulate
from dpfl.errors import BudgetExceededError
from dpfl.run.state import Run
from dpfl.training.evaluate import evaluate

SETTING_D = os.path.join(os.path.dirname(__file__), "..", "experiments", "configs", "settings",
                         "setting-d-fl-std.toml")


class _OpacusFederation:
    """The per-client Opacus loop: one `PrivacyEngine` per client (kept, so that a client selected
    again goes on accounting from its earlier steps), a fresh model copy per client and round."""

    def __init__(self, run: Run, mode: str, clip: float, sigma: float):
        self.run, self.mode, self.clip, self.sigma = run, mode, clip, sigma
        self.model = copy.deepcopy(run.model)
        self.w = run.w.clone()
        self.engines: dict[int, object] = {}

    def _client(self, c: int) -> torch.Tensor:
        from opacus import PrivacyEngine

        run, local = self.run, self.run.local
        idx = torch.from_numpy(np.asarray(run.fed.clients[c]))
        x, y = run.fed.x[idx].to(self.w.dtype), run.fed.y[idx]
        model = copy.deepcopy(self.model)
        run.flat.load_into(model, self.w)
        engine = self.engines.setdefault(c, PrivacyEngine(accountant="rdp"))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=local.batch_size)
        made = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=local.lr),
                                   criterion=torch.nn.CrossEntropyLoss(), data_loader=loader,
                                   noise_multiplier=self.sigma, max_grad_norm=self.clip,
                                   poisson_sampling=True, grad_sample_mode=self.mode)
        gsm, opt, loader = made[0], made[1], made[-1]
        crit = made[2] if self.mode == "ghost" else torch.nn.CrossEntropyLoss()
        steps = 0
        while steps < local.steps:
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                crit(gsm(xb), yb).backward()
                opt.step()
                steps += 1
                if steps == local.steps:
                    break
        return run.flat.flatten(model).to(self.w.dtype) - self.w

    def round(self, cohort: np.ndarray) -> None:
        sizes = torch.from_numpy(self.run.fed.sizes[cohort].astype(np.float64))
        agg = torch.zeros_like(self.w, dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for c, n in zip(cohort.tolist(), sizes.tolist()):
                agg += self._client(int(c)).double() * n
        self.w = self.w + (agg / sizes.sum()).to(self.w.dtype)

    def epsilons(self, delta: float) -> np.ndarray:
        return np.array([e.accountant.get_epsilon(delta) for e in self.engines.values()])


def run_bench(rounds: int = 2, clients: int = 100, clip: float = 1.0, noise_multiplier: float = 1.1,
              mode: str = "hooks", threads: int = 1, config: str = SETTING_D,
              console: Console | None = None) -> dict:
    """Examples/s of local DP-SGD per round, accuracy and record-level ε after `rounds` rounds."""
    console = console or Console()
    torch.set_num_threads(threads)
    cfg = load_config(config, [f"federation.rounds={rounds}", f"federation.clients_per_round={clients}",
                               f"run.threads={threads}", f"eval.every={rounds}", f"train.dpsgd.clip={clip}",
                               f"train.dpsgd.noise_multiplier={noise_multiplier}"])
    run = Run(cfg, None, log=lambda s: None)
    run.setup()
    if run.fed.task != "multiclass":
        raise ValueError("the record-level FL bench runs multiclass tasks (its Opacus side uses cross-entropy)")
    opa = _OpacusFederation(run, mode, clip, noise_multiplier)
    delta, T, B = cfg.train.dpsgd.delta, run.local.steps, run.local.batch_size
    # untimed warm-up of both sides on one client (imports, kernels): dpfl's in a one-client run of its own
    simulate(Run(cfg.model_copy(update={"federation": cfg.federation.model_copy(
        update={"rounds": 1, "clients_per_round": 1})}), None, log=lambda s: None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opa._client(int(run.select(1)[0][0]))
    opa.engines.clear()
    load_before = os.getloadavg()[0]
    rows: list[dict] = []
    last = [{}]
    start = [time.process_time()]

    def opacus_round(m: dict) -> None:  # after each dpfl round: Opacus trains the same cohort
        c_dpfl = time.process_time() - start[0]
        cohort, _ = run.select(m["round"])
        examples = float(T * np.minimum(B, run.fed.sizes[cohort]).sum())  # expected: Σ_k T·q_k·n_k
        t0, c0 = time.perf_counter(), time.process_time()
        opa.round(cohort)
        t_opa, c_opa = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"round": m["round"], "clients": len(cohort), "examples": examples,
                     "dpfl_train_s": m["train_seconds"], "dpfl_round_cpu_s": c_dpfl,
                     "opacus_train_s": t_opa, "opacus_cpu_s": c_opa})
        last[0] = m
        start[0] = time.process_time()

    simulate(run, opacus_round)
    if not rows:  # the record-level budget stopped the run before its first round
        raise BudgetExceededError(f"no round to compare: {run.stopped_reason}")
    m = last[0]
    run.flat.load_into(opa.model, opa.w)
    acc_opa = evaluate(opa.model, run.fed.x_test, run.fed.y_test, run.fed.task)["accuracy"]
    eps_opa = opa.epsilons(delta)
    ex_dpfl = [r["examples"] / r["dpfl_train_s"] for r in rows]
    ex_opa = [r["examples"] / r["opacus_train_s"] for r in rows]
    out = {"config": os.path.normpath(config), "rounds": rounds, "clients_per_round": clients, "steps": T,
           "batch": B, "clip": clip, "delta": delta, "noise_multiplier": noise_multiplier, "opacus_mode": mode,
           "threads": torch.get_num_threads(), "load_1min_before": load_before, "load_1min_after": os.getloadavg()[0],
           "per_round": rows,
           "dpfl": {"examples_per_s": statistics.median(ex_dpfl), "accuracy": m.get("accuracy"),
                    "record_epsilon_max": m["record_epsilon_max"], "record_epsilon_median": m["record_epsilon_median"]},
           "opacus": {"examples_per_s": statistics.median(ex_opa), "accuracy": acc_opa,
                      "record_epsilon_max": float(eps_opa.max()), "record_epsilon_median": float(np.median(eps_opa))}}
    out["speedup"] = out["dpfl"]["examples_per_s"] / out["opacus"]["examples_per_s"]
    _print(out, console)
    return out


def _print(out: dict, console: Console) -> None:
    t = Table(title=f"Record-level DP-SGD in the clients: {out['clients_per_round']} clients × {out['steps']} steps × "
                    f"batch {out['batch']}, C = {out['clip']}, σ = {out['noise_multiplier']}, {out['rounds']} rounds, "
                    f"{out['threads']} thread(s), 1-min load {out['load_1min_before']:.1f} → {out['load_1min_after']:.1f}")
    for col in ("", "examples/s (median round)", "accuracy", "record ε max", "record ε median"):
        t.add_column(col, justify="left" if not col else "right")
    for name, label in (("dpfl", "dpfl cohort engine (train.dpsgd)"),
                        ("opacus", f"per-client Opacus loop ({out['opacus_mode']})")):
        d = out[name]
        acc = "-" if d["accuracy"] is None else f"{d['accuracy']:.4f}"
        t.add_row(label, f"{d['examples_per_s']:.1f}", acc, f"{d['record_epsilon_max']:.3f}",
                  f"{d['record_epsilon_median']:.3f}")
    console.print(t)
    for r in out["per_round"]:
        console.print(f"round {r['round']}: {r['clients']} clients, {r['examples']:.0f} examples; dpfl train "
                      f"{r['dpfl_train_s']:.1f} s wall ({r['dpfl_round_cpu_s']:.1f} s CPU for the whole round), "
                      f"Opacus {r['opacus_train_s']:.1f} s wall ({r['opacus_cpu_s']:.1f} s CPU)")
    console.print(f"dpfl / Opacus examples per second: {out['speedup']:.2f}x (dpfl noise from per-client "
                  f"CryptoRNG streams, Opacus from torch's generator; ε by RDP on both sides, δ = {out['delta']:g})")
