"""Registry, digits, subsets, CIFAR-10 / IMDB local loaders and the synthetic CIFAR / IMDB data."""

import os
import pickle

import numpy as np
import pytest
import torch

from dpfl.data import dataset_options, list_datasets, load_dataset
from dpfl.errors import ConfigError, DataError


def test_registry_and_option_errors():
    names = list_datasets()
    for n in [
        "fashion-mnist",
        "mnist",
        "digits",
        "default",
        "medical-synthetic",
        "cifar10",
        "cifar10-synthetic",
        "imdb",
        "imdb-synthetic",
    ]:
        assert n in names
    with pytest.raises(ConfigError, match="unknown dataset 'mnsit'; allowed: fashion-mnist, mnist"):
        load_dataset("mnsit")
    with pytest.raises(ConfigError, match=r"unknown options \['sise'\]; allowed: size, test_fraction"):
        load_dataset("digits", sise=28)
    assert dataset_options("medical-synthetic")["scale"] == 1.0
    for n in names:  # every loader takes the size options (None = the dataset's own size)
        opts = dataset_options(n)
        assert opts["n_train"] is None and opts["n_test"] is None, n


def test_digits():
    from sklearn.datasets import load_digits

    d8 = load_dataset("digits", seed=3)
    assert d8.x_train.shape == (1437, 1, 8, 8) and d8.n_test == 360
    ref = load_digits()
    # every train image is one of sklearn's, scaled by 1/16
    flat = {tuple(r) for r in (ref.images.reshape(len(ref.images), -1) / 16).astype(np.float32)}
    assert all(tuple(r) in flat for r in d8.x_train.reshape(len(d8.x_train), -1).numpy()[:50])
    # stratified split: each class within one sample of 20 % in the test set
    counts = np.bincount(ref.target)
    assert np.all(np.abs(torch.bincount(d8.y_test).numpy() - counts * 0.2) <= 1)
    d28 = load_dataset("digits", seed=3, size=28)
    assert d28.x_train.shape == (1437, 1, 28, 28)
    assert float(d28.x_train.min()) >= 0.0 and float(d28.x_train.max()) <= 1.0
    assert torch.equal(d28.y_train, d8.y_train)
    # up-sampling preserves the image mean to within interpolation error
    assert torch.allclose(d28.x_train.mean((1, 2, 3)), d8.x_train.mean((1, 2, 3)), atol=0.03)
    assert not torch.equal(load_dataset("digits", seed=4).y_train, d8.y_train)
    with pytest.raises(ConfigError, match="size must be an integer >= 8"):
        load_dataset("digits", size=4)


def test_subsets_are_deterministic():
    a = load_dataset("digits", seed=1, n_train=100, n_test=30)
    b = load_dataset("digits", seed=1, n_train=100, n_test=30)
    full = load_dataset("digits", seed=1)
    assert a.n_train == 100 and a.n_test == 30 and "subset of 100 train" in a.source
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    # rows are rows of the full set, in the original order
    pos = [int(torch.nonzero((full.x_train == r).all(dim=(1, 2, 3)))[0]) for r in a.x_train[:20]]
    assert pos == sorted(pos)
    with pytest.raises(ConfigError, match=r"n_train must be an integer in 1..1437, got 5000"):
        load_dataset("digits", n_train=5000)


# ---- CIFAR-10 -------------------------------------------------------------------------------


def write_cifar_batches(d, rng, n=4):
    d.mkdir()
    data = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, n).tolist()
        data[name] = (x, y)
        with open(d / name, "wb") as f:  # bytes keys, as in the official Python 2 pickles
            pickle.dump({b"batch_label": b"x", b"data": x, b"labels": y}, f, protocol=2)
    return data


def test_cifar10_python_batches(tmp_path):
    data = write_cifar_batches(tmp_path / "cifar-10-batches-py", np.random.default_rng(0))
    ds = load_dataset("cifar10", root=tmp_path)
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_test.shape == (4, 3, 32, 32)
    x1, y1 = data["data_batch_2"]
    # pixel (c, h, w) of image i is byte c*1024 + h*32 + w of its row
    assert float(ds.x_train[4, 2, 5, 7]) == pytest.approx(x1[0, 2 * 1024 + 5 * 32 + 7] / 255)
    assert ds.y_train[4:8].tolist() == y1


def test_cifar10_npz_nhwc(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    np.savez(
        tmp_path / "c.npz", x_train=x, y_train=np.arange(6).reshape(6, 1), x_test=x[:2], y_test=np.arange(2)
    )
    ds = load_dataset("cifar10", root=tmp_path / "c.npz")
    assert float(ds.x_train[3, 1, 4, 9]) == pytest.approx(x[3, 4, 9, 1] / 255)
    assert ds.y_train.tolist() == list(range(6))


def test_cifar10_missing_names_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError) as e:
        load_dataset("cifar10")
    assert str(tmp_path / "cifar-10-batches-py") in str(e.value) and "cifar10-synthetic" in str(e.value)


def test_malicious_pickle_is_refused(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    write_cifar_batches(d, np.random.default_rng(0))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(d / "test_batch", "wb") as f:
        pickle.dump({"data": Evil()}, f)
    with pytest.raises(DataError, match="is not allowed in a data file"):
        load_dataset("cifar10", root=d)


# ---- IMDB -----------------------------------------------------------------------------------


def keras_reference(x_train, y_train, x_test, y_test, num_words, maxlen):
    """Keras 2.2 imdb.load_data + pad_sequences, transcribed with Python lists."""
    np.random.seed(113)
    idx = np.arange(len(x_train))
    np.random.shuffle(idx)
    x_train, y_train = [x_train[i] for i in idx], y_train[idx]
    idx = np.arange(len(x_test))
    np.random.shuffle(idx)
    x_test, y_test = [x_test[i] for i in idx], y_test[idx]
    out = []
    for xs in (x_train, x_test):
        xs = [[1] + [w + 3 for w in x] for x in xs]
        xs = [[w if w < num_words else 2 for w in x] for x in xs]
        rows = []
        for x in xs:
            x = x[-maxlen:]
            rows.append([0] * (maxlen - len(x)) + x)
        out.append(np.array(rows))
    return out[0], y_train, out[1], y_test


def test_imdb_keras_processing(tmp_path):
    rng = np.random.default_rng(2)

    def reviews(n):
        return [list(rng.integers(1, 60, rng.integers(1, 15))) for _ in range(n)]

    xtr, xte = reviews(9), reviews(7)
    ytr, yte = rng.integers(0, 2, 9), rng.integers(0, 2, 7)
    obj = lambda r: np.array(r + [[0]], dtype=object)[:-1]
    np.savez(tmp_path / "imdb.npz", x_train=obj(xtr), y_train=ytr, x_test=obj(xte), y_test=yte)
    ds = load_dataset("imdb", root=tmp_path, num_words=40, maxlen=10)
    rtr, rytr, rte, ryte = keras_reference(xtr, ytr, xte, yte, 40, 10)
    np.testing.assert_array_equal(ds.x_train.numpy(), rtr)
    np.testing.assert_array_equal(ds.x_test.numpy(), rte)
    np.testing.assert_array_equal(ds.y_train.numpy(), rytr)
    np.testing.assert_array_equal(ds.y_test.numpy(), ryte)
    assert ds.x_train.dtype == torch.int64 and ds.task == "binary"


def test_imdb_missing_names_paths(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset("imdb", root=tmp_path)
    assert str(tmp_path / "imdb.npz") in str(e.value) and "imdb-synthetic" in str(e.value)


# ---- synthetic CIFAR / IMDB -----------------------------------------------------------------


def test_cifar10_synthetic_shape_and_signal():
    ds = load_dataset("cifar10-synthetic", seed=5, n_train=400, n_test=200)
    assert ds.x_train.shape == (400, 3, 32, 32) and ds.x_train.dtype == torch.float32
    assert float(ds.x_train.min()) >= 0 and float(ds.x_train.max()) <= 1
    assert torch.equal(ds.x_test, load_dataset("cifar10-synthetic", seed=5, n_train=400, n_test=200).x_test)
    # nearest class mean (from train) classifies the test set far above chance
    means = torch.stack([ds.x_train[ds.y_train == c].mean(0) for c in range(10)])
    pred = torch.cdist(ds.x_test.flatten(1), means.flatten(1)).argmin(1)
    assert (pred == ds.y_test).float().mean() > 0.5


def test_imdb_synthetic_shape_and_signal():
    from sklearn.linear_model import LogisticRegression

    ds = load_dataset("imdb-synthetic", seed=1, n_train=1500, n_test=500)
    x = ds.x_train
    assert x.shape == (1500, 400) and x.dtype == torch.int64
    assert int(x.min()) == 0 and int(x.max()) < 5000
    assert torch.all((x == 1).sum(1) == 1)  # one start token, after the left padding
    first = (x != 0).int().argmax(1)
    assert torch.all(x[torch.arange(len(x)), first] == 1)

    def bow(t):
        return np.stack([np.bincount(r[r > 2], minlength=5000) for r in t.numpy()]) > 0

    clf = LogisticRegression(C=0.1, max_iter=200).fit(bow(x), ds.y_train.numpy())
    assert clf.score(bow(ds.x_test), ds.y_test.numpy()) > 0.7
