"""FedCollabNN experiment and dataset-generation configs (TOML, validated with pydantic)."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpfl.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSection(_Strict):
    dataset: str = "fashion-mnist"
    n_train: int | None = Field(32000, ge=2)
    n_test: int | None = Field(10000, ge=1)
    options: dict = {}


class ModelSpec(_Strict):
    name: str
    options: dict = {}


class CollabSection(_Strict):
    workers: list[int] = [10, 12, 14, 16, 18, 20]
    # worker k gets models[k % len(models)]: a name (built with `model_options`) or {name, options}
    models: list[str | ModelSpec] = ["cnn"]
    model_options: dict = {}
    epochs: int = Field(5, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(0.05, gt=0)
    mode: Literal["sum", "average"] = "average"
    algorithms: list[Literal["fedcollab", "independent", "fedavg"]] = ["fedcollab", "independent", "fedavg"]
    fedavg_sync_every: int = Field(0, ge=0)  # local steps between parameter averages; 0 = once per epoch
    frac_bits: int = Field(24, ge=8, le=40)
    vote_gamma: float = Field(0.05, gt=0)  # LNMax γ of the noisy-vote ensemble accuracy
    device: str = "cpu"  # torch device of the worker models and their data

    @field_validator("workers")
    @classmethod
    def _workers(cls, v):
        if not v or min(v) < 2:
            raise ValueError("workers must list worker counts >= 2")
        return v


class GenerateSection(_Strict):
    workers: int = Field(10, ge=2)
    # teachers: FedCollabNN workers (Alg. 2), or plain PATE teachers trained independently (lr η·w)
    teachers: Literal["fedcollab", "independent"] = "fedcollab"
    n_public: int = Field(1000, ge=1)  # unlabeled queries, taken from the test split
    mechanism: Literal["lnmax", "gnmax", "confident-gnmax"] = "lnmax"
    noise: float = Field(0.05, gt=0)  # γ (lnmax), σ (gnmax) or σ2 (confident-gnmax)
    threshold: float | None = None  # confident-gnmax: answer only if max vote + N(0, σ1²) >= threshold
    sigma1: float | None = Field(None, gt=0)
    threshold_data_independent: bool = False  # confident-gnmax: charge the check α/(2σ1²) regardless
    delta: float = Field(1e-5, gt=0, lt=1)
    moments: int = Field(8, ge=1)
    beta: float | None = Field(None, gt=0)  # smooth-sensitivity β; default 0.09 (lnmax), 0.4/order (gnmax)
    order: float | None = Field(None, gt=1)  # gnmax types: Rényi order of the ε release
    ss_sigma: float = Field(5.0, gt=0)  # gnmax types: release noise SS·N(0, ss_sigma²)
    out_dir: str = "generated"
    csv_features: bool = True
    os_randomness: bool = False  # True: vote noise keyed from the OS (deployment); False: from the seed
    student_model: str | None = None
    student_options: dict = {}
    student_epochs: int = Field(5, ge=1)
    student_lr: float = Field(0.05, gt=0)
    student_batch_size: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _confident(self):
        confident = self.mechanism == "confident-gnmax"
        if confident and (self.threshold is None or self.sigma1 is None):
            raise ValueError("mechanism confident-gnmax needs threshold and sigma1")
        if not confident and (self.threshold is not None or self.sigma1 is not None):
            raise ValueError(f"threshold and sigma1 belong to confident-gnmax, not {self.mechanism}")
        if self.threshold is not None and (math.isnan(self.threshold) or self.threshold == math.inf):
            raise ValueError(f"threshold must be a number or -inf, got {self.threshold}")
        return self


class ExperimentConfig(_Strict):
    seed: int = 0
    out: str = "collab_results.json"
    data: DataSection = DataSection()
    collab: CollabSection = CollabSection()
    generate: GenerateSection | None = None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a TOML config; errors name the file and the bad field."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        raw = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None
    try:
        return ExperimentConfig(**raw)
    except ValidationError as e:
        raise ConfigError(f"{p}: invalid config: {e}") from None
