"""Central DP-SGD training: Poisson-sampled lots, accounting through the privacy ledger.

    plan = make_private_with_epsilon(target_epsilon=2.0, delta=1e-5, sample_rate=256/60000, epochs=5)
    result = train(model, x, y, plan=plan, clip=1.0, lr=0.5, seeds=Seeds(0), x_test=xt, y_test=yt)

Each step draws every example independently with probability q (CryptoRNG: the sample is
secret), processes the variable-size lot in padded chunks of fixed size (masked rows add
nothing), adds N(0, σ²C²) once to the sum and divides by the expected lot size L = qN.
Each chunk's clipped sum comes from ghost.clipped_sum (book-keeping where the model allows it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.func import functional_call

from dpfl.dpsgd.core import check_dp_args, noisy_gradient
from dpfl.dpsgd.ghost import clipped_sum
from dpfl.errors import ConfigError, PrivacyError
from dpfl.privacy.calibration import calibrate_sigma
from dpfl.privacy.events import SampledGaussianEvent
from dpfl.privacy.ledger import Ledger
from dpfl.rng import CryptoRNG, Seeds


@dataclass(frozen=True)
class DPPlan:
    """What DP-SGD runs: noise multiplier σ, Poisson rate q, number of steps T."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def steps_for(epochs: float, sample_rate: float) -> int:
    if not 0 < sample_rate <= 1:
        raise ConfigError(f"sample rate q must be in (0, 1], got {sample_rate}")
    if not epochs > 0:
        raise ConfigError(f"epochs must be > 0, got {epochs}")
    return max(1, round(epochs / sample_rate))


def make_private_with_epsilon(
    target_epsilon: float, delta: float, sample_rate: float, epochs: float, accountant: str = "rdp"
) -> DPPlan:
    """Smallest σ (ledger's `calibrate_sigma`) so that T = epochs/q steps stay within (ε, δ)."""
    steps = steps_for(epochs, sample_rate)
    sigma = calibrate_sigma(target_epsilon, delta, sample_rate, steps, accountant=accountant)
    return DPPlan(sigma, sample_rate, steps)


def poisson_sample(rng: CryptoRNG, n: int, q: float) -> np.ndarray:
    """Indices of a Poisson sample: each of the n examples independently with probability q."""
    return np.flatnonzero(rng.uniform(n) < q)


def padded_chunks(idx: np.ndarray, chunk: int):
    """(indices [chunk], mask [chunk]) covering `idx`; the last chunk is padded with index 0, mask 0."""
    for start in range(0, len(idx), chunk):
        part = idx[start : start + chunk]
        mask = np.zeros(chunk, dtype=np.float32)
        mask[: len(part)] = 1.0
        yield np.pad(part, (0, chunk - len(part))), mask


@torch.no_grad()
def accuracy(
    model: torch.nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor, batch: int = 1000
) -> float:
    correct = 0
    device = next(iter(params.values())).device
    for i in range(0, len(x), batch):
        out = functional_call(model, params, (x[i : i + batch].to(device),)).cpu()
        pred = (out > 0).long() if out.ndim == 1 else out.argmax(dim=1)
        correct += int((pred == y[i : i + batch]).sum())
    return correct / max(1, len(x))


@dataclass
class TrainResult:
    params: dict[str, torch.Tensor]
    epsilon: float
    delta: float
    plan: DPPlan
    test_accuracy: float | None
    history: list[dict] = field(default_factory=list)  # per epoch: step, epsilon, test accuracy
    mean_lot_size: float = 0.0


def train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    plan: DPPlan,
    clip: float,
    lr: float,
    seeds: Seeds,
    delta: float = 1e-5,
    momentum: float = 0.0,
    loss: str = "ce",
    chunk_size: int = 128,
    accountant: str = "rdp",
    ledger: Ledger | None = None,
    x_test: torch.Tensor | None = None,
    y_test: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> TrainResult:
    """DP-SGD for `plan.steps` steps from the model's current parameters; the model is not modified.
    Data stay where they are; each chunk is moved to `device` (noise is drawn on the CPU)."""
    check_dp_args(clip, plan.noise_multiplier, lr)
    if not 0 <= momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {momentum}")
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    n = len(x)
    if ledger is None:
        ledger = Ledger(accountant)
    event = (
        SampledGaussianEvent(plan.noise_multiplier, plan.sample_rate) if plan.noise_multiplier > 0 else None
    )
    if event is None:
        raise PrivacyError("noise multiplier 0 gives no privacy; DP-SGD needs σ > 0")
    torch.manual_seed(seeds.seed("dpsgd", "torch"))  # dropout inside vmap draws from the global generator
    sample_rng, noise_rng = seeds.crypto("dpsgd", "sample"), seeds.crypto("dpsgd", "noise")
    params = {k: v.detach().clone().to(device) for k, v in model.named_parameters()}
    buffers = {k: v.detach().to(device) for k, v in model.named_buffers()}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    expected = plan.sample_rate * n
    steps_per_epoch = max(1, round(1 / plan.sample_rate))
    history, lots = [], 0
    for step in range(1, plan.steps + 1):
        ledger.add(event)  # refuses (BudgetExceededError) before the data is touched
        idx = poisson_sample(sample_rng, n, plan.sample_rate)
        lots += len(idx)
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for part, mask in padded_chunks(idx, chunk_size):
            s = clipped_sum(
                params,
                buffers,
                model,
                x[part].to(device),
                y[part].to(device),
                clip=clip,
                loss=loss,
                mask=torch.from_numpy(mask).to(device),
            )
            for k in total:
                total[k] += s[k]
        g = noisy_gradient(
            total,
            clip=clip,
            noise_multiplier=plan.noise_multiplier,
            expected_batch_size=expected,
            generator=noise_rng,
        )
        for k, p in params.items():
            velocity[k] = momentum * velocity[k] + g[k]
            params[k] = p - lr * velocity[k]
        if step % steps_per_epoch == 0 or step == plan.steps:
            rec = {"step": step, "epoch": step * plan.sample_rate, "epsilon": ledger.epsilon(delta)}
            if x_test is not None:
                rec["test_accuracy"] = accuracy(model, {**params, **buffers}, x_test, y_test)
            history.append(rec)
    acc = history[-1].get("test_accuracy") if history else None
    return TrainResult(params, ledger.epsilon(delta), delta, plan, acc, history, lots / plan.steps)
