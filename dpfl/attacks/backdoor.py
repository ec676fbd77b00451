"""Backdoors (thesis §6.1.2): colluding attackers train on relabelled data.

In-backdoor: every sample of class ``source`` in the attackers' data is labelled ``target``;
honest clients keep the true labels. Metrics: ``source_accuracy`` (test samples of the source
class predicted as source) and ``attack_success`` (predicted as target).

Out-backdoor: class ``source`` is removed from every honest client (and from the test set used
for the global accuracy); a client brings its own source-class samples, labelled ``target``, only
when it acts maliciously, so only attackers ever hold that class. ``drop`` lists further classes
removed from everyone (the thesis drops birds and trucks on CIFAR). Metric: ``attack_success``,
the share of held-out source-class test samples classified as ``target``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from dpfl.attacks.malicious import Colluding
from dpfl.errors import ConfigError, DataError


def _check_class(name: str, attack: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ConfigError(f"attack {attack!r}: {name} must be a class index ≥ 0, got {v!r}")
    return int(v)


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
    """Predicted classes of a multiclass model."""
    model.eval()
    out = []
    for s in range(0, x.shape[0], batch_size):
        xb = x[s : s + batch_size]
        out.append(model(xb.float() if xb.dtype == torch.uint8 else xb).argmax(1))
    model.train()
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


class Backdoor(Colluding):
    def __init__(self, fraction: float, mode: str = "fixed", *, source: int, target: int, **kw):
        super().__init__(fraction, mode, **kw)
        self.source = _check_class("source", self.name, source)
        self.target = _check_class("target", self.name, target)
        if self.source == self.target:
            raise ConfigError(f"attack {self.name!r}: source and target must differ, both are {source}")
        self._y: torch.Tensor | None = None
        self._x_source: torch.Tensor | None = None

    def _check(self, fed: Any, classes: list[int]) -> None:
        if fed.task != "multiclass":
            raise ConfigError(f"attack {self.name!r} needs a multiclass dataset, got a {fed.task} task")
        bad = [c for c in classes if c >= fed.num_classes]
        if bad:
            raise ConfigError(f"attack {self.name!r}: class(es) {bad} out of range; allowed 0..{fed.num_classes - 1}")

    def _relabel(self, fed: Any) -> None:
        self._y = fed.y.clone()
        self._y[fed.y == self.source] = self.target

    def labels(self, run: Any) -> torch.Tensor:
        return self._y

    def _source_predictions(self, run: Any) -> torch.Tensor:
        return predict(run.model, self._x_source, run.cfg.eval.batch_size)


class InBackdoor(Backdoor):
    """Attackers relabel their samples of the source class as the target class (boost: η_Adv)."""

    name = "in-backdoor"

    def prepare(self, fed: Any, seeds: Any) -> Any:
        self._check(fed, [self.source, self.target])
        self._relabel(fed)
        self._x_source = fed.x_test[fed.y_test == self.source]
        return fed

    def evaluate(self, run: Any) -> dict[str, float]:
        p = self._source_predictions(run)
        n = max(1, len(p))
        return {"source_accuracy": float((p == self.source).sum()) / n,
                "attack_success": float((p == self.target).sum()) / n}


class OutBackdoor(Backdoor):
    """The source class exists only in the attackers' data, labelled as the target class."""

    name = "out-backdoor"

    def __init__(self, fraction: float, mode: str = "fixed", *, source: int, target: int,
                 drop: list[int] | None = None, **kw):
        super().__init__(fraction, mode, source=source, target=target, **kw)
        self.drop = [_check_class("drop", self.name, c) for c in (drop or [])]
        if {self.source, self.target} & set(self.drop):
            raise ConfigError(f"attack {self.name!r}: drop {self.drop} must not contain source or target")
        self._aux: list[np.ndarray] = []

    def prepare(self, fed: Any, seeds: Any) -> Any:
        self._check(fed, [self.source, self.target, *self.drop])
        self._relabel(fed)
        y = fed.y.cpu().numpy()
        gone = [self.source, *self.drop]
        honest, self._aux = [], []
        for c in fed.clients:
            honest.append(c[~np.isin(y[c], gone)])
            self._aux.append(c[y[c] == self.source])
        empty = [i for i, c in enumerate(honest) if len(c) == 0]
        if empty:
            raise DataError(f"out-backdoor: removing class(es) {gone} leaves {len(empty)} client(s) without data "
                            f"(e.g. client {empty[0]}); use a partition where every client has other classes")
        yt = fed.y_test
        keep = ~torch.isin(yt, torch.tensor(gone, device=yt.device))
        self._x_source = fed.x_test[yt == self.source]
        return dataclasses.replace(fed, clients=honest, x_test=fed.x_test[keep], y_test=yt[keep],
                                   source=f"{fed.source}; out-backdoor: class(es) {gone} only with attackers")

    def attacker_indices(self, run: Any, client: int) -> np.ndarray:
        return np.concatenate([run.fed.clients[client], self._aux[client]])

    def evaluate(self, run: Any) -> dict[str, float]:
        p = self._source_predictions(run)
        return {"attack_success": float((p == self.target).sum()) / max(1, len(p))}
