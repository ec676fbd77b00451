"""FedCollabNN experiment and dataset-generation configs (TOML, validated with pydantic)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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
    mechanism: Literal["lnmax", "gnmax"] = "lnmax"
    noise: float = Field(0.05, gt=0)  # γ (lnmax) or σ (gnmax)
    delta: float = Field(1e-5, gt=0, lt=1)
    moments: int = Field(8, ge=1)
    beta: float = Field(0.09, gt=0)
    out_dir: str = "generated"
    csv_features: bool = True
    os_randomness: bool = False  # True: vote noise keyed from the OS (deployment); False: from the seed
    student_model: str | None = None
    student_options: dict = {}
    student_epochs: int = Field(5, ge=1)
    student_lr: float = Field(0.05, gt=0)
    student_batch_size: int = Field(64, ge=1)


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
