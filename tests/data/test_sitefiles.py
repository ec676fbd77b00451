"""A site's own data files (CSV, .npz, image folder): exact round trips through `write_site_data`, and one
DataError line naming the file and the problem for every bad input."""

import hashlib
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from dpfl.data import check_input, is_8bit, load_dataset, load_site_data, site_test_split, write_site_data
from dpfl.data.sitefiles import VALUE_RANGES
from dpfl.errors import ConfigError, DataError


def images8(n=12, c=1, side=4, classes=4, seed=0):
    """8-bit images (values k/255) [n, c, side, side] and labels 0..classes-1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, c, side, side), generator=g).to(torch.float32) / 255
    return x, torch.randint(0, classes, (n,), generator=g)


def one_line_error(match, fn, *args, **kw):
    with pytest.raises(DataError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- round trips


def test_csv_round_trip_is_exact_for_any_float32(tmp_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 7, generator=g) * torch.logspace(-40, 30, 7)  # subnormal to huge, both signs
    x[0, 0] = 1 / 3
    y = torch.arange(30) % 5
    write_site_data(tmp_path / "a.csv", x, y, "csv")
    site = load_site_data(tmp_path / "a.csv")
    assert site.x.dtype == torch.float32 and site.y.dtype == torch.int64
    assert torch.equal(site.x, x) and torch.equal(site.y, y)
    assert site.task == "multiclass"


def test_csv_of_images_comes_back_with_shape(tmp_path):
    x, y = images8()
    write_site_data(tmp_path / "a.csv", x, y, "csv")
    header = (tmp_path / "a.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["label", "pixel1"] and len(header) == 17
    site = load_site_data(tmp_path / "a.csv", shape="1,4,4", input_shape=(1, 4, 4), n_classes=4,
                          like="default")
    assert torch.equal(site.x, x) and torch.equal(site.y, y)


def test_npz_round_trip_keeps_task_and_integer_tokens(tmp_path):
    x = torch.randint(0, 5000, (9, 400))
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1])
    write_site_data(tmp_path / "t.npz", x, y, "npz", task="binary")
    site = load_site_data(tmp_path / "t.npz", input_shape=(400,))
    assert site.task == "binary" and site.x.dtype == torch.int64
    assert torch.equal(site.x, x) and torch.equal(site.y, y)


@pytest.mark.parametrize("channels", [1, 3])
def test_image_folder_round_trip_is_exact_for_8bit_images(tmp_path, channels):
    x, y = images8(c=channels)
    assert is_8bit(x)
    write_site_data(tmp_path / "site", x, y, "images", n_classes=5)
    assert (tmp_path / "site" / "classes.txt").read_text().split() == ["0", "1", "2", "3", "4"]
    site = load_site_data(tmp_path / "site", n_classes=5, like="fashion-mnist")
    order = torch.from_numpy(np.argsort(y.numpy(), kind="stable"))  # folders come back grouped by class
    assert torch.equal(site.x, x[order]) and torch.equal(site.y, y[order])
    assert site.classes == ("0", "1", "2", "3", "4")


def test_image_folder_takes_the_models_channel_count(tmp_path):
    x, y = images8(c=3)
    write_site_data(tmp_path / "rgb", x, y, "images")
    gray = load_site_data(tmp_path / "rgb", input_shape=(1, 4, 4))
    assert gray.x.shape == (12, 1, 4, 4)
    # ITU-R 601 luma of the first pixel, as Pillow computes it (rounded to 8 bits)
    first = load_site_data(tmp_path / "rgb").x[0, :, 0, 0] * 255
    luma = (first[0] * 299 + first[1] * 587 + first[2] * 114) / 1000
    assert abs(float(gray.x[0, 0, 0, 0]) * 255 - float(luma)) <= 0.5 + 1e-4


def test_image_folder_without_classes_txt_uses_sorted_folder_names(tmp_path):
    for name, value in (("dog", 10), ("cat", 20)):
        (tmp_path / name).mkdir()
        Image.fromarray(np.full((3, 3), value, dtype=np.uint8)).save(tmp_path / name / "a.png")
    site = load_site_data(tmp_path)
    assert site.classes == ("cat", "dog") and site.y.tolist() == [0, 1]
    assert site.x[:, 0, 0, 0].mul(255).round().tolist() == [20, 10]


@pytest.mark.parametrize("size", [8, 28])
def test_builtin_digits_round_trip_exactly_through_csv_and_npz(tmp_path, size):
    ds = load_dataset("digits", size=size, n_train=150)
    for fmt in ("csv", "npz"):
        write_site_data(tmp_path / f"d.{fmt}", ds.x_train, ds.y_train, fmt)
        site = load_site_data(tmp_path / f"d.{fmt}", shape=(1, size, size), n_classes=10, like="digits",
                              input_shape=(1, size, size))
        assert torch.equal(site.x, ds.x_train) and torch.equal(site.y, ds.y_train), fmt


@pytest.mark.fashion_mnist
def test_builtin_fashion_mnist_round_trips_exactly_in_every_format(tmp_path):
    ds = load_dataset("fashion-mnist", n_train=60, n_test=1)
    for fmt, path in (("csv", "f.csv"), ("npz", "f.npz"), ("images", "f")):
        write_site_data(tmp_path / path, ds.x_train, ds.y_train, fmt, n_classes=10)
        site = load_site_data(tmp_path / path, shape=(1, 28, 28), input_shape=(1, 28, 28), n_classes=10,
                              like="fashion-mnist")
        stable = torch.from_numpy(np.argsort(ds.y_train.numpy(), kind="stable"))
        order = stable if fmt == "images" else slice(None)
        assert torch.equal(site.x, ds.x_train[order]) and torch.equal(site.y, ds.y_train[order]), fmt


def test_kaggle_style_pixel_csv_with_scale(tmp_path):
    pixels = np.arange(2 * 784).reshape(2, 784) % 256
    lines = ["label," + ",".join(f"pixel{k}" for k in range(1, 785))]
    lines += [f"{label}," + ",".join(map(str, row)) for label, row in zip((9, 0), pixels)]
    (tmp_path / "fashion-mnist_train.csv").write_text("\n".join(lines) + "\n")
    path = tmp_path / "fashion-mnist_train.csv"
    msg = one_line_error(r"span \[0, 255\].*give scale=255", load_site_data, path, like="fashion-mnist")
    assert msg.startswith(str(path))
    site = load_site_data(path, scale=255, shape="1,28,28", input_shape=(1, 28, 28), n_classes=10,
                          like="fashion-mnist")
    assert site.x.shape == (2, 1, 28, 28) and site.y.tolist() == [9, 0]
    assert torch.equal(site.x[1, 0, 0, :3], torch.tensor([784, 785, 786]) % 256 / torch.tensor(255.0))


def test_label_column_is_configurable_and_may_sit_anywhere(tmp_path):
    (tmp_path / "t.csv").write_text("age,outcome,bp\n50,1,120.5\n61,0,99\n")
    site = load_site_data(tmp_path / "t.csv", label_column="outcome", task="binary", input_shape=(2,))
    assert site.y.tolist() == [1, 0] and site.x.tolist() == [[50.0, 120.5], [61.0, 99.0]]


def test_sha256_is_the_files_and_changes_with_it(tmp_path):
    x, y = images8()
    write_site_data(tmp_path / "a.npz", x, y, "npz")
    write_site_data(tmp_path / "img", x, y, "images")
    digest = hashlib.sha256((tmp_path / "a.npz").read_bytes()).hexdigest()
    assert load_site_data(tmp_path / "a.npz").sha256 == digest
    before = load_site_data(tmp_path / "img").sha256
    first = min((tmp_path / "img").rglob("*.png"))
    Image.fromarray(np.zeros((4, 4), dtype=np.uint8)).save(first)
    assert load_site_data(tmp_path / "img").sha256 != before


def test_value_ranges_match_the_builtin_loaders():
    ds = load_dataset("digits", size=28, n_train=100)
    lo, hi = VALUE_RANGES["digits"]
    assert float(ds.x_train.min()) >= lo and float(ds.x_train.max()) <= hi
    assert VALUE_RANGES["default"] == VALUE_RANGES["fashion-mnist"] == (0.0, 1.0)


# ---- the model's side


def test_check_input_names_file_found_shape_and_the_models():
    x = torch.zeros(3, 784)
    with pytest.raises(DataError) as e:
        check_input(x, (1, 28, 28), "client-0.csv")
    assert str(e.value) == ("client-0.csv: examples are [784], the model takes [1, 28, 28]; "
                            "give shape=1,28,28 or a model for 784 features")
    check_input(x.reshape(3, 1, 28, 28), (1, 28, 28), "ok")
    check_input(x.reshape(3, 1, 28, 28), (784,), "ok", flat=True)  # an MLP flattens its input
    one_line_error(r"^b\.npz: examples are \[785\] \(785 values\), the model takes \[1, 28, 28\] "
                   r"\(784 values\)$", check_input, torch.zeros(2, 785), (1, 28, 28), "b.npz")
    one_line_error(r"takes 784 features", check_input, torch.zeros(2, 3, 28, 28), (784,), "c.npz", flat=True)


def test_site_test_split_is_disjoint_equal_and_fixed_by_the_seed():
    parts = site_test_split(103, 10, seed=7)
    assert [len(p) for p in parts] == [10] * 10
    assert len(np.unique(np.concatenate(parts))) == 100
    assert all((np.diff(p) > 0).all() for p in parts)
    assert all((a == b).all() for a, b in zip(parts, site_test_split(103, 10, seed=7)))
    assert any((a != b).any() for a, b in zip(parts, site_test_split(103, 10, seed=8)))
    one_line_error("too few", site_test_split, 5, 6, seed=0)


# ---- bad inputs: one line naming the file and the problem


def csv_file(tmp_path, text, name="c.csv"):
    (tmp_path / name).write_text(text)
    return tmp_path / name


@pytest.mark.parametrize("text,kw,match", [
    ("f1,f2\n1,2\n", {}, r"c\.csv: no label column 'label' in the header \(f1, f2\); give label_column=NAME"),
    ("label,f1\n1,2\n", {"label_column": "y"}, "no label column 'y'"),
    ("label,a,b\n1,2,3\n0,2,oops\n", {}, r"c\.csv: row 2, column 'b': 'oops' is not a number"),
    ("label,a,b\n1,2,3\n0,2\n", {}, r"c\.csv: row 2 has 2 cells, the header has 3"),
    ("label,a,b\n1,2,3\n0,,3\n", {}, r"row 2, column 'a': '' is not a number"),
    ("label,a\n0,1\n1,nan\n", {}, r"c\.csv: row 2, column 'a' is nan; features must be finite"),
    ("label,a\n0,inf\n", {}, r"row 1, column 'a' is inf"),
    ("", {}, r"c\.csv: empty file"),
    ("label,a\n", {}, r"c\.csv: no data rows"),
    ("label\n1\n", {}, "only the label column"),
    ("label,a\n2.5,1\n", {}, r"row 1, column 'label': label 2.5 is not an integer class id"),
    ("label,a\n-1,1\n", {}, "label -1 is negative"),
    ("label,a\n0,1\n12,1\n", {"n_classes": 10},
     r"c\.csv: row 2 has label 12; the model has 10 classes \(labels 0..9\)"),
    ("label,a\n0,1\n2,1\n", {"task": "binary"}, r"row 2 has label 2; a binary task's labels are 0 or 1"),
    ("label,a,b\n0,1,2\n", {"shape": "1,3"}, r"shape=1,3 holds 3 values, examples have 2"),
    ("label,a,b\n0,1,2\n", {"input_shape": (3,)}, r"examples are \[2\] \(2 values\), the model takes \[3\]"),
    ("label,a\n0,300\n", {"like": "mnist"}, r"span \[300, 300\], mnist models take values in \[0, 1\]"),
])
def test_bad_csv_gives_one_line(tmp_path, text, kw, match):
    msg = one_line_error(match, load_site_data, csv_file(tmp_path, text), **kw)
    assert msg.startswith(str(tmp_path / "c.csv"))


def test_bad_options_are_config_errors(tmp_path):
    path = csv_file(tmp_path, "label,a\n0,1\n")
    for kw in ({"shape": "1,x"}, {"scale": 0}, {"task": "regression"}):
        with pytest.raises(ConfigError):
            load_site_data(path, **kw)


def npz_file(tmp_path, **arrays):
    np.savez(tmp_path / "n.npz", **arrays)
    return tmp_path / "n.npz"


@pytest.mark.parametrize("arrays,kw,match", [
    ({"x": np.zeros((2, 3))}, {}, r"n\.npz must hold arrays 'x' and 'y', has \['x'\]"),
    ({"x": np.zeros((2, 3)), "y": np.zeros(3, np.int64)}, {}, r"x has 2 examples and y 3 labels"),
    ({"x": np.zeros((0, 3)), "y": np.zeros(0, np.int64)}, {},
     "x has 0 examples and y 0 labels; need the same number, at least one"),
    ({"x": np.zeros((2, 3)), "y": np.zeros(2)}, {}, "labels y must be integers, got float64"),
    ({"x": np.array([[0.0, np.nan]]), "y": np.zeros(1, np.int64)}, {}, r"x\[0\] \(value 1\) is nan"),
    ({"x": np.zeros((2, 3)), "y": np.array([0, 11])}, {"n_classes": 10}, r"y\[1\] has label 11"),
    ({"x": np.zeros((1, 3)), "y": np.zeros(1, np.int64), "task": np.array("regression")}, {}, "task must be"),
    ({"x": np.zeros((1, 3)), "y": np.zeros(1, np.int64), "task": np.array("binary")}, {"task": "multiclass"},
     "the file says task 'binary', the run needs 'multiclass'"),
    ({"x": np.array([["a", "b"]]), "y": np.zeros(1, np.int64)}, {}, "features x must be numbers"),
    ({"x": np.zeros((2, 3)), "y": np.zeros((2, 1), np.int64)}, {}, r"need x \[N, \.\.\.\] and y \[N\]"),
])
def test_bad_npz_gives_one_line(tmp_path, arrays, kw, match):
    msg = one_line_error(match, load_site_data, npz_file(tmp_path, **arrays), **kw)
    assert msg.startswith(str(tmp_path / "n.npz"))


class _Payload:
    """Unpickling this would create the file `marker` (what a hostile pickle could do, harmlessly)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickled_object_arrays_are_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    objs = np.empty(1, dtype=object)
    objs[0] = _Payload(marker)
    path = npz_file(tmp_path, x=objs, y=np.zeros(1, np.int64))
    one_line_error(r"n\.npz: array 'x' holds Python objects \(a pickle\)", load_site_data, path)
    assert not marker.exists()
    (tmp_path / "p.npz").write_bytes(pickle.dumps({"x": 1}))  # a bare pickle named .npz
    one_line_error(r"p\.npz: not an \.npz archive", load_site_data, tmp_path / "p.npz")
    assert not marker.exists()


def test_not_an_archive_missing_and_unknown_files(tmp_path):
    (tmp_path / "z.npz").write_bytes(b"PK\x03\x04 broken")
    one_line_error(r"z\.npz: not", load_site_data, tmp_path / "z.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    os.replace(tmp_path / "one.npy", tmp_path / "one.npz")
    one_line_error(r"one\.npz: one \.npy array, not an \.npz archive", load_site_data, tmp_path / "one.npz")
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as z:
        z.writestr("x.npy", b"not an array")
        z.writestr("y.npy", b"")
    one_line_error(r"junk\.npz: member 'x' is not a NumPy array", load_site_data, tmp_path / "junk.npz")
    one_line_error(r"site data not found: .*nope\.csv", load_site_data, tmp_path / "nope.csv")
    (tmp_path / "d.xlsx").write_bytes(b"x")
    one_line_error(r"d\.xlsx: unknown data format '\.xlsx'", load_site_data, tmp_path / "d.xlsx")


def save(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_ragged_image_sizes_name_the_first_file_that_differs(tmp_path):
    save(tmp_path / "a" / "1.png", np.zeros((28, 28), np.uint8))
    save(tmp_path / "a" / "2.png", np.zeros((28, 28), np.uint8))
    save(tmp_path / "b" / "1.png", np.zeros((32, 30), np.uint8))
    save(tmp_path / "b" / "2.png", np.zeros((31, 31), np.uint8))
    msg = one_line_error("all images must have one size", load_site_data, tmp_path)
    assert msg == (f"{tmp_path / 'b' / '1.png'}: 30x32 pixels, but {tmp_path / 'a' / '1.png'} is 28x28; "
                   "all images must have one size")


@pytest.mark.parametrize("make,kw,match", [
    (lambda r: save(r / "a" / "1.png", np.zeros((4, 4), np.uint16)), {},
     r"1\.png: I;16 images are not supported"),
    (lambda r: (r / "a").mkdir(), {}, "no images"),
    (lambda r: None, {}, "no class folders"),
    (lambda r: (save(r / "a" / "1.png", np.zeros((4, 4), np.uint8)), (r / "classes.txt").write_text("b\n")),
     {}, r"a: folder not named in classes\.txt"),
    (lambda r: (save(r / "a" / "1.png", np.zeros((4, 4), np.uint8)), (r / "a" / "2.png").write_bytes(b"no")),
     {}, r"2\.png: not a readable image"),
    (lambda r: save(r / "a" / "1.png", np.zeros((4, 4), np.uint8)), {"n_classes": 10},
     r"1 classes \(a\), the model has 10; name the model's 10 classes in classes\.txt"),
    (lambda r: save(r / "a" / "1.png", np.zeros((4, 4), np.uint8)), {"input_shape": (1, 28, 28)},
     r"examples are \[1, 4, 4\] \(16 values\), the model takes \[1, 28, 28\]"),
])
def test_bad_image_folders_give_one_line(tmp_path, make, kw, match):
    root = tmp_path / "site"
    root.mkdir()
    make(root)
    msg = one_line_error(match, load_site_data, root, **kw)
    assert str(root) in msg


def test_writer_refuses_what_the_loader_could_not_read_back(tmp_path):
    x, y = images8()
    one_line_error(r"a csv file must end in \.csv", write_site_data, tmp_path / "a.txt", x, y, "csv")
    one_line_error(r"C = 1 or 3", write_site_data, tmp_path / "i", torch.zeros(2, 5), y[:2], "images")
    one_line_error(r"in \[0, 1\]", write_site_data, tmp_path / "j", x * 2, y, "images")
    write_site_data(tmp_path / "k", x, y, "images")
    one_line_error("not an empty folder", write_site_data, tmp_path / "k", x, y, "images")
    with pytest.raises(ConfigError):
        write_site_data(tmp_path / "a.csv", x, y, "xlsx")
    assert not os.path.exists(tmp_path / "a.txt")
