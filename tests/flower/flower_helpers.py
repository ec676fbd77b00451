"""Shared pieces of the Flower tests: a tiny digits federation and the simulator reference."""

from __future__ import annotations

import copy

import tomli_w

from dpfl.config import load_config
from dpfl.engine.simulator import Simulation
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback
from dpfl.schemes.base import RoundContext

# 3 clients of the 8x8 digits, a 64-16-10 MLP; the simulator's sequential engine trains one
# client at a time exactly as a deployed client does (the vectorized engine batches the
# cohort and differs by float rounding, ~3e-8).
BASE = {
    "name": "flower-test", "seed": 5,
    "data": {"dataset": "digits", "n_clients": 3, "partition": "dirichlet", "partition_options": {"alpha": 1.0}},
    "federation": {"rounds": 3, "clients_per_round": 3},
    "train": {"steps": 2, "batch_size": 8, "lr": 0.1},
    "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
    "run": {"engine": "sequential", "threads": 1},
    "scheme": {"name": "fl-std"},
}

SIGN_DP = {"name": "fl-sign-dp", "options": {"sigma": 0.5, "gamma": 0.005}}


def config(scheme: dict | None = None, **sections) -> dict:
    data = copy.deepcopy(BASE)
    if scheme is not None:
        data["scheme"] = scheme
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return data


def simulate(data: dict) -> tuple[Simulation, list[dict]]:
    sim = Simulation(load_config(data=data), None, log=lambda s: None)
    rounds: list[dict] = []
    sim.run(rounds.append)
    return sim, rounds


def node_configs(n: int, seeded: bool = True) -> dict[int, dict]:
    return {100 + i: {"partition-id": i, "num-partitions": n, "dpfl-seeded": seeded} for i in range(n)}


def loopback(data: dict, seeded: bool = True, cls=Loopback, **kw) -> tuple[Coordinator, Loopback]:
    lb = cls({"dpfl-config": tomli_w.dumps(data)}, node_configs(data["data"]["n_clients"], seeded), **kw)
    co = Coordinator(load_config(data=data), lb, lb.nodes, reproducible=True, log=lambda s: None)
    return co, lb


def require_row_contract() -> None:
    """Deployed clients run the chain on their own row: the DP share must be calibrated on the
    round's k from the context (RoundContext.answering), not on the number of rows it sees."""
    assert "answering" in RoundContext.__dataclass_fields__, (
        "RoundContext.answering is missing: apply the contract change in docs/deployment.md "
        "(DP shares calibrated on ctx.k(), sign ties drawn per client); without it a deployed "
        "FL-SIGN-DP client adds noise for k = 1 and differs from the simulator")
