"""IDX reader, MNIST-style directory loading, and the error messages."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dpfl.data import load_dataset, read_idx
from dpfl.data.idx import MNIST_FILES
from dpfl.errors import DataError, DpflError

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def idx_bytes(arr: np.ndarray, code: int) -> bytes:
    """Independent IDX writer (struct-based)."""
    head = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    big = arr.astype(arr.dtype.newbyteorder(">"))
    return head + big.tobytes()


def write(path: Path, arr: np.ndarray, code: int = 0x08, gz: bool = False) -> Path:
    data = idx_bytes(arr, code)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize(
    "dtype,code",
    [
        (np.uint8, 0x08),
        (np.int8, 0x09),
        (np.int16, 0x0B),
        (np.int32, 0x0C),
        (np.float32, 0x0D),
        (np.float64, 0x0E),
    ],
)
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, dtype, code, gz):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    got = read_idx(write(tmp_path / "a", arr, code, gz))
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize(
    "data,fragment",
    [
        (b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", "two zero bytes"),
        (b"\x00\x00\x07\x01\x00\x00\x00\x01\x07", "unknown IDX type code 0x07"),
        (b"\x00\x00\x08\x02\x00\x00\x00\x01", "truncated IDX header"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x03\x07\x07", "needs 3 data bytes, file has 2"),
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (b"\x1f\x8b\x08garbage", "not valid gzip"),
    ],
)
def test_read_idx_errors_name_the_file(tmp_path, data, fragment):
    p = tmp_path / "bad-idx"
    p.write_bytes(data)
    with pytest.raises(DataError) as e:
        read_idx(p)
    assert fragment in str(e.value) and str(p) in str(e.value)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(DpflError, match="cannot read IDX file .*nope"):
        read_idx(tmp_path / "nope")


def make_mnist_dir(d: Path, n_train=12, n_test=5, gz=True, rng=None) -> dict:
    rng = rng or np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    d.mkdir(parents=True, exist_ok=True)
    for key, name in MNIST_FILES.items():
        write(d / (name + (".gz" if gz else "")), arrays[key], gz=gz)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_from_root(tmp_path, gz):
    a = make_mnist_dir(tmp_path, gz=gz)
    ds = load_dataset("mnist", root=tmp_path)
    assert ds.x_train.shape == (12, 1, 28, 28) and ds.x_train.dtype == torch.float32
    np.testing.assert_array_equal(ds.x_train[:, 0].numpy(), a["train_images"].astype(np.float32) / 255)
    np.testing.assert_array_equal(ds.y_test.numpy(), a["test_labels"])
    assert ds.y_train.dtype == torch.int64 and ds.task == "multiclass" and ds.num_classes == 10
    assert str(tmp_path) in ds.source


def test_mnist_from_env_and_subdir(tmp_path, monkeypatch):
    make_mnist_dir(tmp_path / "fashion-mnist")
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path))
    ds = load_dataset("fashion-mnist")
    assert ds.n_train == 12 and str(tmp_path / "fashion-mnist") in ds.source


def test_missing_fashion_mnist_names_paths_and_apt_package(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset("fashion-mnist", root=tmp_path)
    msg = str(e.value)
    assert str(tmp_path) in msg and str(tmp_path / "fashion-mnist") in msg
    assert "dataset-fashion-mnist" in msg and "train-images-idx3-ubyte" in msg


def test_missing_mnist_suggests_substitutes(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError) as e:
        load_dataset("mnist")
    msg = str(e.value)
    assert str(tmp_path / "mnist") in msg and "/usr/share/datasets/mnist" in msg
    assert "digits" in msg and "dataset-fashion-mnist" in msg


def test_partial_directory_is_not_used(tmp_path):
    make_mnist_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="not found"):
        load_dataset("mnist", root=tmp_path)


def test_inconsistent_files_name_both(tmp_path):
    make_mnist_dir(tmp_path)
    write(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(11, np.uint8), gz=True)
    with pytest.raises(DataError) as e:
        load_dataset("mnist", root=tmp_path)
    assert "12 images" in str(e.value) and "11 labels" in str(e.value)
    assert "train-labels-idx1-ubyte.gz" in str(e.value)


def test_wrong_image_shape_and_label_range(tmp_path):
    make_mnist_dir(tmp_path)
    write(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((5, 27, 28), np.uint8), gz=True)
    with pytest.raises(
        DataError, match=r"t10k-images-idx3-ubyte.gz: expected uint8 images of shape \[N, 28, 28\]"
    ):
        load_dataset("mnist", root=tmp_path)
    make_mnist_dir(tmp_path)
    write(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(5, 10, np.uint8), gz=True)
    with pytest.raises(DataError, match="label 10 outside 0..9"):
        load_dataset("mnist", root=tmp_path)


def test_default_falls_back_to_digits(tmp_path):
    ds = load_dataset("default", root=tmp_path)
    assert ds.name == "digits" and ds.x_train.shape[1:] == (1, 28, 28)
    assert "fashion-mnist not found" in ds.source and str(tmp_path) in ds.source


@pytest.mark.skipif(
    not (FMNIST / "train-images-idx3-ubyte.gz").exists(), reason="dataset-fashion-mnist not installed"
)
def test_real_fashion_mnist():
    ds = load_dataset("fashion-mnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    # first test image, decoded by hand from the gzip stream
    with gzip.open(FMNIST / "t10k-images-idx3-ubyte.gz") as f:
        raw = f.read(16 + 784)
    assert struct.unpack(">4I", raw[:16]) == (2051, 10000, 28, 28)
    first = np.frombuffer(raw[16:], np.uint8).reshape(28, 28).astype(np.float32) / 255
    np.testing.assert_array_equal(ds.x_test[0, 0].numpy(), first)
    assert load_dataset("default", n_train=100).name == "fashion-mnist"
