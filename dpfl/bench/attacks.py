"""Membership leakage of FL-STD vs FL-SIGN vs the DP schemes (`dpfl bench attacks`).

Every scheme trains the same small model on the same small federation (a Fashion-MNIST subset
that a 784-128-10 MLP overfits: few samples per client, many local steps), then the loss-
threshold attack (`dpfl.attacks.membership`) runs on the final global model. The DP schemes use
central noise placement: the same noise on the aggregate, hence the same final-model
distribution and ε as distributed noise, without simulating secure aggregation. Each round draws
a fixed cohort; ε assumes Poisson sampling with q = per_round / clients (as the thesis; FL-SIGN-DP's
bound has no sampling-without-replacement form), and the table says so.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _config(scheme: str, options: dict[str, Any], dataset: str, n_train: int, n_test: int, clients: int,
            per_round: int, rounds: int, seed: int):
    from dpfl.config import load_config

    return load_config(data={
        "name": f"leakage-{scheme}", "seed": seed,
        "data": {"dataset": dataset, "n_clients": clients, "options": {"n_train": n_train, "n_test": n_test}},
        "model": {"name": "mlp", "options": {"in_features": 784 if dataset != "digits" else 64, "hidden": 128}},
        "train": {"steps": 20, "batch_size": 10, "lr": 0.1},
        "federation": {"rounds": rounds, "clients_per_round": per_round},
        "scheme": {"name": scheme, "options": options}, "privacy": {"accountant": "rdp", "sampling_assumption": "poisson"},
        "eval": {"every": rounds}})


def run_bench(dataset: str = "fashion-mnist", n_train: int = 2000, n_test: int = 2000, clients: int = 100,
              per_round: int = 20, rounds: int = 60, sigma: float = 1.0, gamma: float = 0.01, samples: int = 2000, seed: int = 0,
              console: Console | None = None) -> dict[str, dict[str, float]]:
    """Train FL-STD, FL-SIGN, FL-STD-DP and FL-SIGN-DP and measure each final model's leakage."""
    import numpy as np

    from dpfl.attacks.membership import membership_advantage
    from dpfl.engine.simulator import simulate
    from dpfl.run.state import Run
    from dpfl.training.evaluate import evaluate

    console = console or Console()
    central = {"sigma": sigma, "noise": "central", "secure_aggregation": False}
    schemes = {"fl-std": {}, "fl-sign": {"gamma": gamma}, "fl-std-dp": {**central, "clip": "auto"},
               "fl-sign-dp": {**central, "gamma": gamma}}
    out: dict[str, dict[str, float]] = {}
    for name, opts in schemes.items():
        run = Run(_config(name, opts, dataset, n_train, n_test, clients, per_round, rounds, seed), None,
                  log=lambda s: None)
        summary = simulate(run)
        members = np.concatenate(run.fed.clients)
        train = evaluate(run.model, run.fed.x[members], run.fed.y[members], run.fed.task)
        test = evaluate(run.model, run.fed.x_test, run.fed.y_test, run.fed.task)
        res = membership_advantage(run.model, run.fed, samples=samples, seed=seed)
        out[name] = {"train_accuracy": train["accuracy"], "test_accuracy": test["accuracy"],
                     "epsilon": summary["epsilon_final"], **res.as_dict()}
    t = Table(title=f"membership leakage after {rounds} rounds ({dataset}, {n_train} training samples, "
                    f"{clients} clients, {per_round} per round, δ = 1e-5; ε assumes Poisson sampling "
                    f"with q = {per_round}/{clients})")
    for c in ("scheme", "train acc", "test acc", "ε", "advantage ± se", "best advantage", "AUC"):
        t.add_column(c, justify="left" if c == "scheme" else "right")
    for name, r in out.items():
        eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
        t.add_row(name, f"{r['train_accuracy']:.3f}", f"{r['test_accuracy']:.3f}", eps,
                  f"{r['advantage']:.3f} ± {r['advantage_se']:.3f}", f"{r['best_advantage']:.3f}", f"{r['auc']:.3f}")
    console.print(t)
    return out
