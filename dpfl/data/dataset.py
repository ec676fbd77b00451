"""The `Dataset` record every loader returns, and helpers shared by the loaders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds

DATA_DIR_ENV = "DPFL_DATA_DIR"
SYSTEM_DATA_DIR = Path("/usr/share/datasets")


@dataclass
class Dataset:
    """A train/test dataset, model-ready.

    x tensors: images float32 [N, C, H, W] in [0, 1]; medical float32 [N, 7280] (float16 when
    compact: cast gathered batches to float32, the values are exact); imdb int64 tokens [N, 400].
    y tensors: int64 class ids (0/1 for binary tasks).
    `client_indices`: a natural partition into clients (medical: hospitals), or None.
    `public`: (x, y) the server may use (medical: the 356-patient hospital, also the last
    entry of `client_indices`), or None.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    task: str  # "multiclass" | "binary"
    source: str
    client_indices: list[np.ndarray] | None = None
    public: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.task not in ("multiclass", "binary"):
            raise ConfigError(f"task must be 'multiclass' or 'binary', got {self.task!r}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if len(x) != len(y):
                raise DataError(f"{self.name}: x_{split} has {len(x)} rows but y_{split} has {len(y)}")
            if y.dtype != torch.int64:
                raise DataError(f"{self.name}: y_{split} must be int64, got {y.dtype}")

    @property
    def n_train(self) -> int:
        return len(self.y_train)

    @property
    def n_test(self) -> int:
        return len(self.y_test)

    def summary(self) -> dict[str, object]:
        """Shapes, dtypes and class counts, for printing."""
        out: dict[str, object] = {
            "name": self.name,
            "task": self.task,
            "source": self.source,
            "x_train": f"{list(self.x_train.shape)} {str(self.x_train.dtype).removeprefix('torch.')}",
            "x_test": f"{list(self.x_test.shape)} {str(self.x_test.dtype).removeprefix('torch.')}",
            "train classes": torch.bincount(self.y_train, minlength=self.num_classes).tolist(),
            "test classes": torch.bincount(self.y_test, minlength=self.num_classes).tolist(),
        }
        if self.client_indices is not None:
            sizes = [len(c) for c in self.client_indices]
            out["clients"] = f"{len(sizes)} (sizes {min(sizes)}..{max(sizes)})"
        if self.public is not None:
            out["public"] = f"{len(self.public[1])} samples"
        return out


def data_dirs(name: str, root: str | os.PathLike | None, *extra: str) -> list[Path]:
    """Directories to search for `name`: `root` (and root/name) if given, else the configured
    directory ($DPFL_DATA_DIR), /usr/share/datasets/<name> and the Keras cache."""
    names = (name, *extra)
    if root is not None:
        root = Path(root).expanduser()
        return [root] + [root / n for n in names]
    dirs = []
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        dirs += [Path(env).expanduser() / n for n in names] + [Path(env).expanduser()]
    dirs += [SYSTEM_DATA_DIR / n for n in names]
    dirs += [Path.home() / ".keras" / "datasets" / n for n in names]
    return list(dict.fromkeys(dirs))


def take(n: int | None, total: int, rng: np.random.Generator, what: str) -> np.ndarray | None:
    """A sorted random subset of size `n` of range(total), or None for all."""
    if n is None:
        return None
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= total:
        raise ConfigError(f"{what} must be an integer in 1..{total}, got {n!r}")
    return np.sort(rng.choice(total, size=int(n), replace=False))


def subset(ds: Dataset, seed: int, n_train: int | None = None, n_test: int | None = None) -> Dataset:
    """Deterministic random subsets of the train and test sets (order preserved)."""
    s = Seeds(seed)
    tr = take(n_train, ds.n_train, s.numpy("data", ds.name, "subset", "train"), "n_train")
    te = take(n_test, ds.n_test, s.numpy("data", ds.name, "subset", "test"), "n_test")
    if tr is not None:
        if ds.client_indices is not None:
            raise ConfigError(
                f"{ds.name} has a natural client partition; reduce it with scale=, not n_train="
            )
        ds.x_train, ds.y_train = ds.x_train[tr], ds.y_train[tr]
        ds.source += f"; random subset of {len(tr)} train samples"
    if te is not None:
        ds.x_test, ds.y_test = ds.x_test[te], ds.y_test[te]
        ds.source += f"; random subset of {len(te)} test samples"
    return ds


def images_to_tensor(x: np.ndarray) -> torch.Tensor:
    """uint8 images [N, H, W] or [N, C, H, W] -> float32 [N, C, H, W] in [0, 1]."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    if t.ndim == 3:
        t = t.unsqueeze(1)
    return t.to(torch.float32).div_(255.0)


def labels_to_tensor(y: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(y).astype(np.int64).reshape(-1))


COMPACT_DTYPES = (torch.uint8, torch.float16, torch.bfloat16)  # how features may be stored (binary, half)


def as_model_input(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Features kept in compact storage (uint8, half precision) cast to the model's float dtype; others as they are."""
    return x.to(dtype) if x.dtype in COMPACT_DTYPES else x
