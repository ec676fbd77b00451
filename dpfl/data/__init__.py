"""Datasets (real files found locally, or synthetic), partitioners and down-sampling.

    ds = load_dataset("fashion-mnist", n_train=6000)
    clients = partition(ds.y_train.numpy(), 600, "shards", seed=0)

Nothing is downloaded. Real files are looked up in `root` (when given), else in
$DPFL_DATA_DIR, /usr/share/datasets/<name> and ~/.keras/datasets/<name>.
"""

from __future__ import annotations

import inspect
import os

from dpfl.data.cifar import load_cifar10
from dpfl.data.dataset import Dataset
from dpfl.data.idx import read_idx
from dpfl.data.images import load_default, load_digits, load_fashion_mnist, load_mnist
from dpfl.data.imdb import load_imdb
from dpfl.data.medical import load_medical_synthetic
from dpfl.data.partition import downsample_majority, partition
from dpfl.data.sitefiles import (
    SITE_FORMATS,
    SiteData,
    check_input,
    is_8bit,
    load_site_data,
    site_test_split,
    write_site_data,
)
from dpfl.data.synthetic import load_cifar10_synthetic, load_imdb_synthetic
from dpfl.errors import ConfigError

DATASETS = {  # name -> (loader, description)
    "fashion-mnist": (load_fashion_mnist, "Fashion-MNIST IDX files (Debian package dataset-fashion-mnist)"),
    "mnist": (load_mnist, "MNIST IDX files from a local directory"),
    "digits": (load_digits, "scikit-learn 8x8 digits (size=28 up-samples for the thesis CNN)"),
    "default": (load_default, "fashion-mnist if found, else digits at 28x28"),
    "medical-synthetic": (
        load_medical_synthetic,
        "synthetic in-hospital mortality, 7,280 features, hospitals",
    ),
    "cifar10": (load_cifar10, "CIFAR-10 python batches or .npz from a local directory"),
    "cifar10-synthetic": (load_cifar10_synthetic, "synthetic 32x32x3 images, 10 classes"),
    "imdb": (load_imdb, "Keras imdb.npz from a local directory (vocab 5000, maxlen 400)"),
    "imdb-synthetic": (load_imdb_synthetic, "synthetic token sequences shaped like Keras IMDB"),
}


def list_datasets() -> dict[str, str]:
    """Dataset names and one-line descriptions."""
    return {name: desc for name, (_, desc) in DATASETS.items()}


def dataset_options(name: str) -> dict[str, object]:
    """The options `load_dataset(name, ...)` accepts, with their defaults."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")
    params = inspect.signature(DATASETS[name][0]).parameters
    return {k: p.default for k, p in params.items() if k not in ("root", "seed")}


def load_dataset(name: str, root: str | os.PathLike | None = None, seed: int = 0, **options) -> Dataset:
    """Load dataset `name` (see `list_datasets()`); `options` are checked against `dataset_options`."""
    allowed = dataset_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"dataset {name!r} got unknown options {unknown}; allowed: {', '.join(allowed)}")
    return DATASETS[name][0](root=root, seed=seed, **options)


__all__ = [
    "SITE_FORMATS",
    "Dataset",
    "SiteData",
    "check_input",
    "dataset_options",
    "downsample_majority",
    "is_8bit",
    "list_datasets",
    "load_dataset",
    "load_site_data",
    "partition",
    "read_idx",
    "site_test_split",
    "write_site_data",
]
