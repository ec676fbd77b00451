"""A streamed round (signSGD, run.max_cohort): the cohort is trained, signed and sent piece by piece, and
the round equals the one that puts the pieces back together."""

import torch

from dpfl.config import load_config
from dpfl.engine.simulator import Simulator
from dpfl.run.state import Run


def _sim(streams: bool, max_cohort: int = 6, attack: dict | None = None) -> Run:
    data = {"name": "stream", "seed": 3, "data": {"dataset": "digits", "n_clients": 20},
            "model": {"name": "mlp", "options": {"in_features": 64, "hidden": 16}},
            "train": {"batch_size": 8, "lr": 0.2}, "federation": {"rounds": 3},
            "scheme": {"name": "signsgd", "options": {"gamma": 0.01}}, "run": {"max_cohort": max_cohort}}
    if attack:
        data["attack"] = attack
    sim = Run(load_config(data=data), None, log=lambda s: None)
    sim.scheme.streams = streams
    return sim


def _spy(sim: Run) -> list[int]:
    """The rows of every tensor that reaches local training's caller and the transport."""
    seen, train, send = [], sim.trainer.train, sim.scheme.transport.transmit

    def tr(w, x, y, batches, *a, **k):
        seen.append(batches.shape[0])
        return train(w, x, y, batches, *a, **k)

    def tx(u, ctx):
        seen.append(u.shape[0])
        return send(u, ctx)

    sim.trainer.train, sim.scheme.transport.transmit = tr, tx
    return seen


def _metrics(sim: Run) -> list[dict]:
    out = []
    for _ in range(3):
        m = Simulator(sim).step_round()
        out.append({k: v for k, v in m.items() if not k.endswith("_seconds")})
    return out


def test_a_streamed_round_equals_the_whole_cohort_round_and_holds_one_piece_at_a_time():
    whole, streamed = _sim(False), _sim(True)
    assert Simulator(streamed).piece == 6 and Simulator(whole).piece == 0
    seen_whole, seen_streamed = _spy(whole), _spy(streamed)
    a, b = _metrics(whole), _metrics(streamed)
    assert a == b and a[0]["answered"] == 20 and a[0]["up_bytes"] > 0
    assert torch.equal(whole.w, streamed.w)
    assert max(seen_streamed) == 6 and seen_streamed[:4] == [6, 6, 6, 6]  # train, send, train, send, ...
    assert 20 in seen_whole  # the unstreamed round sends all 20 rows at once


def test_a_round_with_a_whole_cohort_step_does_not_stream():
    sim = _sim(True, attack={"name": "random-update", "fraction": 0.2, "options": {"sigma": 1.0}})
    assert Simulator(sim).piece == 0  # the attack acts on the whole cohort after the chain
    assert Simulator(_sim(True, max_cohort=0)).piece == 0
