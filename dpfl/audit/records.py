"""Record-level audit of `train.dpsgd` inside the clients: canary records through the real per-example
clipping and noise (Steinke et al. 2023's input-space canaries).

Canary j is a test example with a wrong label (its label shifted by a random 1 … C−1). With probability
1/2 it is included: appended to the training data of one client drawn at random, where it is sampled,
clipped and noised by DP-SGD like every other record of that client (the record-level accountant sees the
client's size with it). An excluded canary is in no client's data.

Scores (higher: more likely included):

    black box   ℓ_j(w_0) − ℓ_j(w_T)                      how much the final model learnt the wrong label
    white box   Σ_t ⟨−∇ℓ_j(w_{t−1}), Δ_t⟩ / ‖Δ_t‖²     each released update's alignment with the canary's
                                                         descent direction, weighted as for client canaries
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dpfl.config import RunConfig
from dpfl.data.dataset import as_model_input
from dpfl.engine.simulator import simulate
from dpfl.errors import ConfigError
from dpfl.run.state import Federation, Run


class RecordCanaryRun(Run):
    """A `Run` whose clients' data hold the included canary records."""

    def __init__(self, cfg: RunConfig, canaries: int, out_dir: str | Path | None = None,
                 log: Callable[[str], None] = print, overwrite: bool = False):
        if cfg.train.dpsgd is None:
            raise ConfigError("the config has no train.dpsgd: no record-level audit")
        if cfg.attack is not None and cfg.attack.name != "none":
            raise ConfigError("an audit runs without an attack: remove the [attack] section")
        super().__init__(cfg, out_dir, log, overwrite)
        fed = self.fed
        if fed.task != "multiclass":
            raise ConfigError(f"a record-level audit mislabels canaries of a multiclass task; "
                              f"{fed.dataset or cfg.data.dataset} is {fed.task}")
        m = int(canaries)
        if m > len(fed.y_test):
            raise ConfigError(f"--canaries {m}: the canary records are test examples, and there are "
                              f"{len(fed.y_test)}")
        rng = self.seeds.numpy("audit", "records")
        pick = torch.from_numpy(rng.choice(len(fed.y_test), size=m, replace=False)).to(fed.x_test.device)
        shift = torch.from_numpy(rng.integers(1, fed.num_classes, size=m)).to(fed.y_test.device)
        x = fed.x_test[pick]
        flat = x.reshape(m, -1)  # each canary's features in a random order of its own: an image of no class
        order = torch.from_numpy(np.argsort(rng.random(flat.shape), axis=1)).to(x.device)
        self.canary_x = torch.gather(flat, 1, order).reshape(x.shape)
        self.canary_y = (fed.y_test[pick] + shift.to(fed.y_test.dtype)) % fed.num_classes
        self.included = self.seeds.numpy("audit", "include").random(m) < 0.5
        owner = rng.integers(0, len(fed.clients), size=m)
        first = len(fed.y)
        inc = torch.from_numpy(np.flatnonzero(self.included)).to(pick.device)
        clients = [c.copy() for c in fed.clients]
        for k, j in enumerate(np.flatnonzero(self.included)):
            clients[owner[j]] = np.append(clients[owner[j]], first + k)
        self.fed = Federation(torch.cat([fed.x, self.canary_x[inc]]), torch.cat([fed.y, self.canary_y[inc]]),
                              clients, fed.x_test, fed.y_test, fed.task, fed.num_classes, fed.source, fed.public,
                              fed.dataset)

    def losses(self, w: torch.Tensor) -> np.ndarray:
        """ℓ_j(w) of every canary (cross-entropy with its wrong label), float64 [m]."""
        self.flat.load_into(self.model, w)
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                dtype = next(self.model.parameters()).dtype
                out = [F.cross_entropy(self.model(as_model_input(x, dtype)), y, reduction="none")
                       for x, y in zip(self.canary_x.split(256), self.canary_y.split(256))]
        finally:
            self.model.train(was)
        return torch.cat(out).to(torch.float64).cpu().numpy()

    def descent_dots(self, w: torch.Tensor, delta: torch.Tensor) -> np.ndarray:
        """⟨−∇ℓ_j(w), Δ⟩ for every canary, float64 [m] (per-example gradients with torch.func)."""
        from torch.func import functional_call, grad, vmap

        self.flat.load_into(self.model, w)
        names = [n for n, _ in self.model.named_parameters()]
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        dtype = next(self.model.parameters()).dtype

        def loss(p, x, y):
            return F.cross_entropy(functional_call(self.model, p, (as_model_input(x[None], dtype),)), y[None])

        was = self.model.training
        self.model.eval()
        out = []
        try:
            for x, y in zip(self.canary_x.split(128), self.canary_y.split(128)):
                g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
                flat = torch.cat([g[n].reshape(len(x), -1) for n in names], dim=1)  # the model's parameter order
                out.append(-(flat.to(torch.float64) @ delta.to(flat.device, torch.float64)))
        finally:
            self.model.train(was)
        return torch.cat(out).cpu().numpy()


def run_record_audit(cfg: RunConfig, canaries: int, observe: str = "white", out_dir: str | Path | None = None,
                     log: Callable[[str], None] = print, overwrite: bool = False,
                     on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train once with canary records; return their scores and the run's record-level accounting."""
    run = RecordCanaryRun(cfg, canaries, out_dir, log, overwrite)
    run.setup()
    w0 = run.w.detach().clone()
    prev = [w0]
    white = np.zeros(canaries) if observe == "white" else None
    released = [0]

    def score(m: dict[str, Any]) -> None:
        w = run.w.detach().clone()
        delta = w - prev[0]
        sq = float(delta.to(torch.float64).pow(2).sum())
        if white is not None and "aborted" not in m and sq > 0:
            white[:] += run.descent_dots(prev[0], delta) / sq
            released[0] += 1
        prev[0] = w
        if on_round is not None:
            on_round(m)

    summary = simulate(run, score)
    black = run.losses(w0) - run.losses(run.w.detach())
    run.flat.load_into(run.model, run.w)
    rec = summary.get("record_level") or {}
    return {"level": "record", "summary": summary, "included": run.included,
            "scores": {"white": white, "black": black}, "released_rounds": released[0],
            "canary": "test examples with a wrong label", "epsilon": rec.get("epsilon_max"),
            "delta": cfg.train.dpsgd.delta}
