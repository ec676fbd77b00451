"""Central DP-SGD on a named dataset and model, from a validated config."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from dpfl.data import load_dataset
from dpfl.dpsgd.ghost import path_for
from dpfl.dpsgd.train import DPPlan, make_private_with_epsilon, steps_for, train
from dpfl.errors import ConfigError
from dpfl.models import build_model, count_params
from dpfl.rng import Seeds


class DPSGDConfig(BaseModel):
    """Exactly one of `noise_multiplier` and `target_epsilon`; the lot size is L = q·N."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = "fashion-mnist"
    n_train: int | None = None
    n_test: int | None = None
    model: str = "cnn"
    model_options: dict = {}
    epochs: float = 1.0
    lot_size: int = 256
    clip: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5
    lr: float = 0.5
    momentum: float = 0.0
    accountant: str = "rdp"
    chunk_size: int = 128
    seed: int = 0
    device: str = "cpu"

    @model_validator(mode="after")
    def _one_noise_spec(self):
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        return self


def config_from(**kw) -> DPSGDConfig:
    try:
        return DPSGDConfig(**kw)
    except ValidationError as e:
        raise ConfigError(f"invalid DP-SGD config: {e}") from None


def plan_for(cfg: DPSGDConfig, n: int) -> DPPlan:
    """σ, q and the steps of `cfg` on n training examples (σ calibrated when a target ε is given)."""
    if not 0 < cfg.lot_size <= n:
        raise ConfigError(f"lot_size must be in [1, {n}] (training examples), got {cfg.lot_size}")
    q = cfg.lot_size / n
    if cfg.target_epsilon is not None:
        return make_private_with_epsilon(cfg.target_epsilon, cfg.delta, q, cfg.epochs, cfg.accountant)
    return DPPlan(cfg.noise_multiplier, q, steps_for(cfg.epochs, q))


def run_central(cfg: DPSGDConfig) -> dict:
    """Load data and model, calibrate σ if a target ε is given, train, report."""
    ds = load_dataset(cfg.dataset, seed=cfg.seed, n_train=cfg.n_train, n_test=cfg.n_test)
    model = build_model(cfg.model, seed=cfg.seed, **cfg.model_options)
    n = ds.n_train
    plan = plan_for(cfg, n)
    q = plan.sample_rate
    t0 = time.perf_counter()
    res = train(
        model,
        ds.x_train,
        ds.y_train,
        plan=plan,
        clip=cfg.clip,
        lr=cfg.lr,
        seeds=Seeds(cfg.seed),
        delta=cfg.delta,
        momentum=cfg.momentum,
        loss="bce" if ds.task == "binary" else "ce",
        chunk_size=cfg.chunk_size,
        accountant=cfg.accountant,
        x_test=ds.x_test,
        y_test=ds.y_test,
        device=cfg.device,
    )
    seconds = time.perf_counter() - t0
    return {
        "dataset": ds.name,
        "n_train": n,
        "n_test": ds.n_test,
        "model": cfg.model,
        "params": count_params(model),
        "clipping_path": path_for(model),
        "noise_multiplier": plan.noise_multiplier,
        "sample_rate": q,
        "steps": plan.steps,
        "clip": cfg.clip,
        "epsilon": res.epsilon,
        "delta": cfg.delta,
        "accountant": cfg.accountant,
        "test_accuracy": res.test_accuracy,
        "mean_lot_size": res.mean_lot_size,
        "seconds": seconds,
        "history": res.history,
    }
