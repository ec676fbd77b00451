"""FedCollabNN (Alg. 2) and its two baselines: traditional FL (Alg. 1) and independent training.

Alg. 2, per step: every worker k computes its minibatch loss ℒ^k with its *own* model θ^k; the
losses are summed by additive secret sharing (the aggregator opens only Σℒ^k, or the average in
`mode="average"`) and broadcast; every worker back-propagates the aggregate and takes an SGD
step. The opened scalar carries no autograd graph, so the gradient that reaches θ^k is that of
the aggregate *function*, ∂(Σ_j w ℒ^j)/∂θ^k = w ∂ℒ^k/∂θ^k (w = 1 or 1/K): no other worker's
data enters it (reference note B1.5). `independent` trains each model on its own loss with
learning rate η·w, so comparing the two measures whether loss aggregation collaborates.

Alg. 1: one shared architecture; workers start each round from the global θ, train
`sync_every` steps locally, and the parameters are averaged by additive secret sharing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dpfl.collab.sharing import Traffic, secure_sum
from dpfl.errors import ConfigError
from dpfl.pate.votes import noisy_max, vote_counts
from dpfl.rng import Seeds

MODES = ("sum", "average")
ALGORITHMS = ("fedcollab", "independent", "fedavg")


@dataclass
class Worker:
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor


@dataclass
class RunLog:
    algorithm: str
    lr: float
    history: list[dict] = field(default_factory=list)  # one record per evaluation
    traffic: Traffic = field(default_factory=Traffic)
    broadcast_bytes: int = 0
    opened_values: int = 0  # scalars or vectors the aggregator reconstructed
    max_open_error: float = 0.0  # |opened aggregate − float aggregate| (fixed-point rounding)
    final_params: list[torch.Tensor] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "algorithm": self.algorithm,
            "lr": self.lr,
            "history": self.history,
            "peer_messages": self.traffic.peer_messages,
            "peer_bytes": self.traffic.peer_bytes,
            "upload_messages": self.traffic.upload_messages,
            "upload_bytes": self.traffic.upload_bytes,
            "broadcast_bytes": self.broadcast_bytes,
            "opened_values": self.opened_values,
            "max_open_error": self.max_open_error,
        }


def steps_per_epoch(workers: list[Worker], batch_size: int) -> int:
    return max(math.ceil(len(w.y) / batch_size) for w in workers)


def _batches(workers: list[Worker], batch_size: int, seeds: Seeds, epoch: int):
    """Per step, one (x, y) minibatch per worker; each worker walks its own seeded permutation
    (a worker with fewer batches than the longest starts over)."""
    perms = [
        torch.randperm(len(w.y), generator=seeds.torch("collab", "batches", k, epoch))
        for k, w in enumerate(workers)
    ]
    for t in range(steps_per_epoch(workers, batch_size)):
        out = []
        for w, p in zip(workers, perms, strict=True):
            nb = math.ceil(len(p) / batch_size)
            idx = p[(t % nb) * batch_size : (t % nb + 1) * batch_size].to(w.x.device)
            out.append((w.x[idx], w.y[idx]))
        yield out


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    """Logits on the CPU; batches run on the model's device."""
    device = next(model.parameters()).device
    model.eval()
    out = torch.cat([model(x[i : i + batch].to(device)).cpu() for i in range(0, len(x), batch)])
    model.train()
    return out


def evaluate(
    models: list[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    vote_gamma: float,
    rng_seeds: Seeds,
    tag: tuple,
) -> dict:
    """Per-worker accuracy and three ensemble rules: plurality vote, LNMax noisy vote, softmax mean."""
    logits = [predict_logits(m, x) for m in models]
    preds = np.stack([lg.argmax(1).numpy() for lg in logits])  # [K, N]
    yn = y.numpy()
    num_classes = logits[0].shape[1]
    counts = vote_counts(preds, num_classes)
    noisy = noisy_max(counts, "lnmax", vote_gamma, rng_seeds.crypto("collab", "eval-vote", *tag))
    soft = torch.stack([lg.softmax(1) for lg in logits]).mean(0).argmax(1).numpy()
    return {
        "worker_accuracy": [float(np.mean(p == yn)) for p in preds],
        "vote_accuracy": float(np.mean(counts.argmax(1) == yn)),
        "noisy_vote_accuracy": float(np.mean(noisy == yn)),
        "softmax_accuracy": float(np.mean(soft == yn)),
    }


def _check(workers: list[Worker], epochs: int, batch_size: int, lr: float) -> None:
    if len(workers) < 2:
        raise ConfigError(f"need at least 2 workers, got {len(workers)}")
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ConfigError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")


def train_losses(
    workers: list[Worker],
    *,
    combine: str,
    epochs: int,
    batch_size: int,
    lr: float,
    seeds: Seeds,
    frac_bits: int = 24,
    on_epoch: Callable[[int, list[nn.Module]], dict] | None = None,
) -> RunLog:
    """Alg. 2 (`combine` = "sum" or "average") or independent training (`combine` = "independent")."""
    _check(workers, epochs, batch_size, lr)
    if combine not in MODES + ("independent",):
        raise ConfigError(f"combine must be one of {MODES + ('independent',)}, got {combine!r}")
    k = len(workers)
    log = RunLog("independent" if combine == "independent" else f"fedcollab-{combine}", lr)
    opts = [torch.optim.SGD(w.model.parameters(), lr=lr) for w in workers]
    rng = seeds.crypto("collab", "shares", combine)
    for epoch in range(1, epochs + 1):
        for batch in _batches(workers, batch_size, seeds, epoch):
            losses = [F.cross_entropy(w.model(xb), yb) for w, (xb, yb) in zip(workers, batch, strict=True)]
            for o in opts:
                o.zero_grad(set_to_none=True)
            if combine == "independent":
                for loss in losses:
                    loss.backward()
            else:
                weight = 1.0 if combine == "sum" else 1.0 / k
                total = weight * torch.stack(losses).sum()
                values = np.array([v.detach().item() for v in losses])
                opened, traffic = secure_sum(values, frac_bits, rng)
                opened = float(opened) * weight  # what the aggregator broadcasts
                log.traffic.add(traffic)
                log.broadcast_bytes += k * 8
                log.opened_values += 1
                log.max_open_error = max(log.max_open_error, abs(opened - weight * float(values.sum())))
                total.backward()
            for o in opts:
                o.step()
        if on_epoch is not None:
            log.history.append({"epoch": epoch, **on_epoch(epoch, [w.model for w in workers])})
    log.final_params = [parameters_to_vector(w.model.parameters()).detach().cpu().clone() for w in workers]
    return log


def train_fedavg(
    workers: list[Worker],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seeds: Seeds,
    sync_every: int | None = None,
    frac_bits: int = 24,
    on_epoch: Callable[[int, list[nn.Module]], dict] | None = None,
) -> RunLog:
    """Alg. 1: FedAvg from worker 0's initial θ, parameters averaged by secret sharing every
    `sync_every` local steps (default: once per epoch) and at the end of every epoch."""
    _check(workers, epochs, batch_size, lr)
    shapes = {tuple(p.shape for p in w.model.parameters()) for w in workers}
    if len(shapes) != 1:
        raise ConfigError("traditional FL (Alg. 1) needs the same architecture on every worker")
    k = len(workers)
    spe = steps_per_epoch(workers, batch_size)
    sync_every = spe if sync_every in (None, 0) else int(sync_every)
    if sync_every < 1:
        raise ConfigError(f"sync_every must be >= 1 (or 0 for once per epoch), got {sync_every}")
    log = RunLog("fedavg", lr)
    rng = seeds.crypto("collab", "shares", "fedavg")
    theta = parameters_to_vector(workers[0].model.parameters()).detach().clone()
    opts = [torch.optim.SGD(w.model.parameters(), lr=lr) for w in workers]

    def sync() -> None:
        nonlocal theta
        rows = np.stack(
            [parameters_to_vector(w.model.parameters()).detach().double().cpu().numpy() for w in workers]
        )
        total, traffic = secure_sum(rows, frac_bits, rng)
        new = torch.from_numpy(total / k).to(device=theta.device, dtype=theta.dtype)
        log.traffic.add(traffic)
        log.broadcast_bytes += k * new.numel() * new.element_size()
        log.opened_values += 1
        log.max_open_error = max(log.max_open_error, float(np.abs(total / k - rows.mean(0)).max()))
        theta = new

    for w in workers:
        vector_to_parameters(theta.clone(), w.model.parameters())  # own copy: no aliasing
    for epoch in range(1, epochs + 1):
        since = 0
        for batch in _batches(workers, batch_size, seeds, epoch):
            for w, o, (xb, yb) in zip(workers, opts, batch, strict=True):
                o.zero_grad(set_to_none=True)
                F.cross_entropy(w.model(xb), yb).backward()
                o.step()
            since += 1
            if since == sync_every:
                sync()
                since = 0
                for w in workers:
                    vector_to_parameters(theta.clone(), w.model.parameters())  # own copy: no aliasing
        if since:
            sync()
            for w in workers:
                vector_to_parameters(theta.clone(), w.model.parameters())  # own copy: no aliasing
        if on_epoch is not None:
            log.history.append({"epoch": epoch, **on_epoch(epoch, [workers[0].model])})
    log.final_params = [theta.cpu().clone()]
    return log
