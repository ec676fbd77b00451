"""MNIST / Fashion-MNIST (IDX files), scikit-learn digits, and the "default" image dataset."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from dpfl.data.dataset import DATA_DIR_ENV, Dataset, data_dirs, images_to_tensor, labels_to_tensor, subset
from dpfl.data.idx import MNIST_FILES, find_idx_files, load_idx_split
from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds

APT_PACKAGE = "dataset-fashion-mnist"
TORCHVISION_DIRS = {"fashion-mnist": "FashionMNIST/raw", "mnist": "MNIST/raw"}


def find_mnist_dir(name: str, root: str | os.PathLike | None) -> tuple[dict, list]:
    """The IDX files of `name`, and the directories tried."""
    tried = data_dirs(name, root, TORCHVISION_DIRS[name])
    for d in tried:
        files = find_idx_files(d)
        if files is not None:
            return files, tried
    return {}, tried


def missing_mnist_error(name: str, tried: list) -> DataError:
    files = ", ".join(f"{f}[.gz]" for f in MNIST_FILES.values())
    paths = "\n  ".join(str(p) for p in tried)
    if name == "fashion-mnist":
        fix = (
            f"install the Debian package {APT_PACKAGE} (apt-get install {APT_PACKAGE}; it puts the files in "
            f"/usr/share/datasets/fashion-mnist/), or pass root= / set {DATA_DIR_ENV}"
        )
    else:
        fix = (
            f"no Debian package ships MNIST: put the four files in a directory and pass root= or set "
            f"{DATA_DIR_ENV}; or use 'fashion-mnist' (apt-get install {APT_PACKAGE}) or 'digits'"
        )
    return DataError(f"{name}: IDX files ({files}) not found. Paths tried:\n  {paths}\nFix: {fix}")


def load_mnist_like(
    name: str, root=None, seed: int = 0, n_train: int | None = None, n_test: int | None = None
) -> Dataset:
    """MNIST or Fashion-MNIST from the four IDX files: images float32 [N, 1, 28, 28] in [0, 1]."""
    files, tried = find_mnist_dir(name, root)
    if not files:
        raise missing_mnist_error(name, tried)
    xtr, ytr, xte, yte = load_idx_split(files)
    ds = Dataset(
        name,
        images_to_tensor(xtr),
        labels_to_tensor(ytr),
        images_to_tensor(xte),
        labels_to_tensor(yte),
        num_classes=10,
        task="multiclass",
        source=f"IDX files in {files['train_images'].parent}",
    )
    return subset(ds, seed, n_train, n_test)


def load_fashion_mnist(
    root=None, seed: int = 0, n_train: int | None = None, n_test: int | None = None
) -> Dataset:
    return load_mnist_like("fashion-mnist", root, seed, n_train, n_test)


def load_mnist(root=None, seed: int = 0, n_train: int | None = None, n_test: int | None = None) -> Dataset:
    return load_mnist_like("mnist", root, seed, n_train, n_test)


def load_digits(
    root=None,
    seed: int = 0,
    size: int = 8,
    test_fraction: float = 0.2,
    n_train: int | None = None,
    n_test: int | None = None,
) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1,797 images, values 0..16 scaled to [0, 1]).

    A stratified random train/test split (`test_fraction`). `size=28` up-samples bilinearly to
    28x28 so the thesis MNIST CNN applies unchanged.
    """
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    if not isinstance(size, int) or size < 8:
        raise ConfigError(
            f"digits size must be an integer >= 8 (8 = original, 28 = MNIST-sized), got {size!r}"
        )
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"digits test_fraction must be in (0, 1), got {test_fraction!r}")
    d = sk_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / np.float32(16.0)).unsqueeze(1)
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp_(0.0, 1.0)
    idx_tr, idx_te = train_test_split(
        np.arange(len(d.target)),
        test_size=test_fraction,
        stratify=d.target,
        random_state=Seeds(seed).seed("data", "digits", "split") % 2**32,
    )
    y = labels_to_tensor(d.target)
    ds = Dataset(
        "digits",
        x[idx_tr],
        y[idx_tr],
        x[idx_te],
        y[idx_te],
        num_classes=10,
        task="multiclass",
        source=f"scikit-learn load_digits, {size}x{size}" + (" (bilinear up-sampling)" if size != 8 else ""),
    )
    return subset(ds, seed, n_train, n_test)


def load_default(root=None, seed: int = 0, n_train: int | None = None, n_test: int | None = None) -> Dataset:
    """Fashion-MNIST if its files are found, else digits at 28x28 (`source` says which)."""
    files, tried = find_mnist_dir("fashion-mnist", root)
    if files:
        return load_fashion_mnist(root, seed, n_train, n_test)
    ds = load_digits(root, seed, size=28, n_train=n_train, n_test=n_test)
    ds.source += " (fashion-mnist not found in: " + ", ".join(str(p) for p in tried) + ")"
    return ds
