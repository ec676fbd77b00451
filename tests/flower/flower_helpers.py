"""Shared pieces of the Flower tests: a tiny digits federation and the simulator reference."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import tomli_w

from dpfl.config import load_config
from dpfl.engine import simulator
from dpfl.flower.coordinator import Coordinator
from dpfl.flower.loopback import Loopback
from dpfl.run.state import Run
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


def simulate(data: dict) -> tuple[Run, list[dict]]:
    sim = Run(load_config(data=data), None, log=lambda s: None)
    rounds: list[dict] = []
    simulator.simulate(sim, rounds.append)
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


def site_files(data: dict, root, formats: tuple[str, ...] = ("csv", "npz", "npz")) -> dict[int, dict]:
    """Each client's own training and held-out files (its partition and its `site_test_split` part,
    as `dpfl data export` writes them), in the given formats: node config entries per client id."""
    from pathlib import Path

    from dpfl.data import site_test_split, write_site_data
    from dpfl.rng import Seeds
    from dpfl.run.state import build_federation

    cfg = load_config(data=data)
    fed = build_federation(cfg, Seeds(cfg.seed))
    parts = site_test_split(len(fed.y_test), cfg.data.n_clients, cfg.seed)
    out = {}
    for i, (idx, fmt) in enumerate(zip(fed.clients, formats)):
        train, test = Path(root) / f"client-{i}.{fmt}", Path(root) / f"client-{i}-test.{fmt}"
        write_site_data(train, fed.x[idx], fed.y[idx], fmt)
        write_site_data(test, fed.x_test[parts[i]], fed.y_test[parts[i]], fmt)
        out[i] = {"data-path": str(train), "test-path": str(test)}
        if fmt == "csv":
            out[i]["data-shape"] = ",".join(str(s) for s in fed.x.shape[1:])
    return out


def held_out_counts(data: dict, w) -> dict:
    """The federated evaluation the sites of `site_files` give for the global model `w`: counts on
    the union of their held-out parts."""
    import torch

    from dpfl.data import site_test_split
    from dpfl.training.evaluate import evaluate_counts

    sim = Run(load_config(data=data), None, log=lambda s: None)
    idx = torch.from_numpy(__import__("numpy").concatenate(
        site_test_split(len(sim.fed.y_test), sim.cfg.data.n_clients, sim.cfg.seed)))
    sim.flat.load_into(sim.model, w)
    return evaluate_counts(sim.model, sim.fed.x_test[idx], sim.fed.y_test[idx], sim.fed.task)


@contextlib.contextmanager
def recording_words(into: dict[int, np.ndarray]):
    """Keep each seeded client's encoded row, by cohort position, as `train.sa_train` encodes it
    (the row is masked in the same message and never stored on the node)."""
    from dpfl.flower import node

    orig = node.encode_words

    def wrap(sa, u, k, rng, index=None):
        words, bits = orig(sa, u, k, rng, index)
        into[index] = words[0].copy()
        return words, bits

    node.encode_words = wrap
    try:
        yield
    finally:
        node.encode_words = orig
