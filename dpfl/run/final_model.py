"""The final global model of a finished run directory (config.toml + checkpoint.pt), with its federation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpfl.config import RunConfig, load_config
from dpfl.errors import ConfigError, DataError
from dpfl.models import build_model
from dpfl.models.flat import FlatParams
from dpfl.rng import Seeds
from dpfl.run import checkpoint
from dpfl.run.state import CHECKPOINT, CONFIG, build_federation, device


def load_final_model(run_dir: str | Path) -> tuple[nn.Module, Any, RunConfig]:
    """(model holding the checkpoint's w, the run's federation rebuilt from its config, the config)."""
    run = Path(run_dir)
    if not (run / CONFIG).is_file() or not (run / CHECKPOINT).is_file():
        raise ConfigError(f"{run} is not a run directory (needs {CONFIG} and {CHECKPOINT})")
    cfg = load_config(run / CONFIG)
    seeds = Seeds(cfg.seed)
    fed = build_federation(cfg, seeds)  # the clients' original data
    dev = device(cfg)
    model = build_model(cfg.model.name, seed=seeds.seed("model"), **cfg.model.options).to(dev)
    w = checkpoint.load(run / CHECKPOINT).get("w")  # plain data only: a crafted file cannot run code
    flat = FlatParams(model)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.numel() != flat.n:
        what = f"{w.numel()} values" if isinstance(w, torch.Tensor) else type(w).__name__
        raise DataError(f"{run / CHECKPOINT}: w is {what}, the model has {flat.n} float parameters")
    flat.load_into(model, w.to(dev))
    return model, fed, cfg
