"""A site's own data files: CSV, NumPy .npz, or an image folder, loaded and checked.

    site = load_site_data("/data/client-0.csv", shape="1,28,28", input_shape=(1, 28, 28), n_classes=10,
                          like="fashion-mnist")
    site.x, site.y, site.task, site.sha256

Formats (docs/site-data.md):
- CSV: a header line, a label column (`label_column`), every other column a numeric feature ->
  float32 [N, F], or [N, *shape] with `shape`. Values as given, divided by `scale` if given.
- .npz: arrays `x`, `y` and optionally a 0-d string `task` (no pickles); float features -> float32,
  integer features (token ids) kept as integers.
- image folder: root/<class name>/*.png|*.jpg|*.jpeg; labels from `classes.txt` (one name a line,
  line i = label i) or else the sorted folder names. Pixels / 255 -> float32 [N, C, H, W].

Every bad input raises one DataError (ConfigError for a bad option) line naming the file and the problem.
`write_site_data` writes the same formats; `site_test_split` is a site's share of a held-out test set.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpfl.data.dataset import images_to_tensor
from dpfl.data.partition import partition
from dpfl.errors import ConfigError, DataError
from dpfl.rng import Seeds

SITE_FORMATS = ("csv", "npz", "images")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
CLASSES_FILE = "classes.txt"
TASKS = ("multiclass", "binary")
# feature values the built-in datasets give their models (`like`): images are float32 pixels / 255
VALUE_RANGES = {name: (0.0, 1.0) for name in
                ("fashion-mnist", "mnist", "digits", "default", "cifar10", "cifar10-synthetic")}
_GRAY_MODES, _COLOR_MODES = ("1", "L", "LA"), ("P", "RGB", "RGBA", "CMYK", "YCbCr")


@dataclass(frozen=True)
class SiteData:
    """A site's examples: x [N, ...] (float32, or integer token ids from an .npz), y int64 [N]."""

    x: torch.Tensor
    y: torch.Tensor
    task: str  # "multiclass" | "binary"
    source: str  # what was read, for logs
    sha256: str  # of the file (image folder: of classes.txt and every image, see `_folder_digest`)
    classes: tuple[str, ...] | None = None  # image folders: the class names, label i = classes[i]

    def __len__(self) -> int:
        return len(self.y)


def load_site_data(
    path: str | os.PathLike,
    *,
    label_column: str = "label",
    task: str | None = None,
    shape: str | Sequence[int] | None = None,
    scale: float | None = None,
    input_shape: Sequence[int] | None = None,
    flat: bool = False,
    n_classes: int | None = None,
    like: str | None = None,
) -> SiteData:
    """Load a site's CSV, .npz or image folder and check it (one DataError line if anything is wrong).

    label_column: the CSV's label column. task: "multiclass" | "binary" (default: the .npz's `task`,
    else multiclass). shape: reshape each example (CSV rows, .npz examples), e.g. "1,28,28".
    scale: divide CSV / .npz feature values by it (255 for 0..255 pixels; image folders always / 255).
    The model's side, each checked when given: input_shape (one example; an image folder is converted
    to input_shape[0] channels), flat (the model flattens its input: only the number of values must
    match), n_classes (labels in 0..n_classes-1; binary labels are 0 or 1), like (the built-in dataset
    the model was made for: feature values must lie in its range, see VALUE_RANGES).
    """
    p = Path(path)
    if task is not None and task not in TASKS:
        raise ConfigError(f"task must be 'multiclass' or 'binary', got {task!r}")
    fmt = site_format(p)
    if fmt == "csv":
        x, y, file_task, source, digest, classes = _read_csv(p, label_column)
    elif fmt == "npz":
        x, y, file_task, source, digest, classes = _read_npz(p)
    else:
        if scale is not None:
            raise ConfigError(f"{p}: scale does not apply to an image folder (its pixels are divided by 255)")
        channels = input_shape[0] if input_shape is not None and len(input_shape) == 3 and not flat else None
        x, y, file_task, source, digest, classes = _read_folder(p, channels)
    task = _task(p, task, file_task)
    if scale is not None:
        x = _scaled(x, scale)
    if shape is not None:
        x = _reshaped(p, x, shape)
    site = SiteData(x, y, task, source, digest, classes)
    _check(p, site, fmt, input_shape, flat, n_classes, like)
    return site


def site_format(path: Path) -> str:
    """"csv", "npz" or "images" (a folder), from the path; DataError if missing or none of these."""
    if path.is_dir():
        return "images"
    if not path.exists():
        raise DataError(f"site data not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".npz"):
        return suffix[1:]
    raise DataError(f"{path}: unknown data format {suffix or '(no suffix)'!r}; give a .csv or .npz file "
                    "or an image folder (root/<class>/*.png)")


def check_input(x: torch.Tensor, expected_shape: Sequence[int], what: str, *, flat: bool = False) -> None:
    """DataError unless every example of x [N, ...] has `expected_shape` (the model's input;
    flat: the model flattens its input, so only the number of values must match)."""
    found, want = list(x.shape[1:]), [int(s) for s in expected_shape]
    n_found, n_want = math.prod(found), math.prod(want)
    if found == want or (flat and n_found == n_want):
        return
    if flat:
        raise DataError(f"{what}: examples are {found} ({n_found} values), the model takes {n_want} features")
    if n_found == n_want:
        other = f"{n_found} features" if len(found) == 1 else f"{found} inputs"
        raise DataError(f"{what}: examples are {found}, the model takes {want}; give shape="
                        f"{','.join(map(str, want))} or a model for {other}")
    raise DataError(f"{what}: examples are {found} ({n_found} values), "
                    f"the model takes {want} ({n_want} values)")


def site_test_split(n_test: int, n_clients: int, seed: int) -> list[np.ndarray]:
    """Each site's held-out part of a test set of n_test examples: n_clients disjoint random parts of
    n_test // n_clients indices each (sorted; the remainder is unused), fixed by the config seed."""
    if not 1 <= n_clients <= n_test:
        raise DataError(f"the test set has {n_test} examples, too few to give each of {n_clients} sites one")
    seed = Seeds(seed).seed("site-test")
    return [np.sort(p) for p in partition(np.zeros(n_test, dtype=np.int64), n_clients, "shards", seed=seed)]


# ---- CSV


# what a reader gives: x, y, the file's task (or None), source, sha256, class names (or None)
_Read = tuple[torch.Tensor, torch.Tensor, "str | None", str, str, "tuple[str, ...] | None"]


def _read_csv(p: Path, label_column: str) -> _Read:
    raw = _read_bytes(p)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text (byte {e.start}); save the CSV as UTF-8") from None
    header = next(csv.reader(io.StringIO(text)), None)
    if not header:
        raise DataError(f"{p}: empty file; a CSV needs a header line and at least one row")
    names = [h.strip() for h in header]
    label = _label_index(p, names, label_column)
    table = _parse_table(p, text, names)
    features = np.delete(table, label, axis=1)
    feature_names = names[:label] + names[label + 1:]
    y = _integer_labels(p, table[:, label], lambda i: f"row {i + 1}, column {label_column!r}")
    _check_finite(p, features, lambda i, j: f"row {i + 1}, column {feature_names[j]!r}")
    source = f"CSV {p} ({len(y)} rows, {features.shape[1]} features, label column {label_column!r})"
    x = torch.from_numpy(features.astype(np.float32))
    return x, y, None, source, hashlib.sha256(raw).hexdigest(), None


def _label_index(p: Path, names: list[str], label_column: str) -> int:
    hits = [i for i, n in enumerate(names) if n == label_column]
    if len(hits) != 1:
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} columns)" if len(names) > 5 else "")
        problem = "no" if not hits else f"{len(hits)} columns named"
        raise DataError(f"{p}: {problem} label column {label_column!r} in the header ({shown}); "
                        "give label_column=NAME")
    if len(names) < 2:
        raise DataError(f"{p}: the header has only the label column; features are missing")
    return hits[0]


def _parse_table(p: Path, text: str, names: list[str]) -> np.ndarray:
    """All data rows as float64 [N, columns] (blank lines skipped)."""
    if not text.partition("\n")[2].strip():
        raise DataError(f"{p}: no data rows after the header")
    try:
        table = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, ndmin=2, comments=None,
                           quotechar='"', dtype=np.float64)
    except ValueError as e:
        raise DataError(f"{p}: {_first_bad_cell(text, names) or e}") from None
    if table.shape[1] != len(names):
        raise DataError(f"{p}: rows have {table.shape[1]} cells, the header has {len(names)}")
    return table


def _first_bad_cell(text: str, names: list[str]) -> str | None:
    """Where np.loadtxt failed, in words: a row with the wrong number of cells, or a cell not a number."""
    rows = (r for r in csv.reader(io.StringIO(text)) if r)
    next(rows)
    for i, row in enumerate(rows, start=1):
        if len(row) != len(names):
            return f"row {i} has {len(row)} cells, the header has {len(names)}"
        for name, cell in zip(names, row):
            try:
                float(cell)
            except ValueError:
                return f"row {i}, column {name!r}: {cell.strip()!r} is not a number"
    return None


# ---- .npz


def _read_npz(p: Path) -> _Read:
    raw = _read_bytes(p)
    arrays = _npz_arrays(p, raw)
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise DataError(f"{p} must hold arrays 'x' and 'y', has {sorted(arrays)}")
    x, y = arrays["x"], arrays["y"]
    if x.ndim < 1 or y.ndim != 1:
        raise DataError(f"{p}: need x [N, ...] and y [N], got x {list(x.shape)} and y {list(y.shape)}")
    if len(x) != len(y) or len(y) == 0:
        raise DataError(f"{p}: x has {len(x)} examples and y {len(y)} labels; need the same number, "
                        "at least one")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{p}: labels y must be integers, got {y.dtype}")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{p}: features x must be numbers, got {x.dtype}")
    file_task = None
    if "task" in arrays:
        t = arrays["task"]
        if t.ndim != 0 or t.dtype.kind != "U":
            raise DataError(f"{p}: 'task' must be a 0-d string array, got {t.dtype} {list(t.shape)}")
        file_task = str(t)
    if x.dtype.kind in "iu":  # token ids stay integers (uint8 stays compact)
        xt = torch.from_numpy(x.astype(np.uint8 if x.dtype == np.uint8 else np.int64))
    else:
        _check_finite(p, x.reshape(len(x), -1), lambda i, j: f"x[{i}] (value {j})")
        xt = torch.from_numpy(x.astype(np.float32))
    yt = _integer_labels(p, y, lambda i: f"y[{i}]")
    source = f"npz {p} ({len(yt)} examples {list(x.shape[1:])})"
    return xt, yt, file_task, source, hashlib.sha256(raw).hexdigest(), None


def _npz_arrays(p: Path, raw: bytes) -> dict[str, np.ndarray]:
    """Every array of the archive, never unpickling (object arrays are refused, naming the array)."""
    try:
        z = np.load(io.BytesIO(raw), allow_pickle=False)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DataError(f"{p}: not a valid .npz file ({e})") from None
    except ValueError as e:  # np.load refusing a pickle, or anything else that is no NumPy file
        raise DataError(f"{p}: not an .npz archive of plain arrays ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataError(f"{p}: one .npy array, not an .npz archive; save with np.savez(path, x=x, y=y)")
    with z:
        return {key: _npz_array(p, z, key) for key in z.files}


def _npz_array(p: Path, z, key: str) -> np.ndarray:
    try:
        a = z[key]
    except ValueError as e:
        if "pickle" in str(e):
            raise DataError(f"{p}: array {key!r} holds Python objects (a pickle); save plain numeric "
                            "arrays (and task as a string)") from None
        raise DataError(f"{p}: array {key!r} is not a valid .npy array ({e})") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise DataError(f"{p}: array {key!r} cannot be read ({e})") from None
    if not isinstance(a, np.ndarray):
        raise DataError(f"{p}: member {key!r} is not a NumPy array")
    return a


# ---- image folders


def _read_folder(root: Path, channels: int | None) -> _Read:
    classes, from_file = _classes(root)
    files = [(f, label) for label, name in enumerate(classes) for f in _images(root / name)]
    if not files:
        raise DataError(f"{root}: no images (.png, .jpg) in its class folders {list(classes)}")
    modes = _check_images(root, [f for f, _ in files])
    if channels is None:
        channels = 1 if all(m in _GRAY_MODES for m in modes) else 3
    if channels not in (1, 3):
        raise DataError(f"{root}: images give 1 (grayscale) or 3 (RGB) channels, the model takes {channels}")
    pixels = np.stack([_pixels(f, channels) for f, _ in files])
    x = images_to_tensor(pixels)
    y = torch.tensor([label for _, label in files], dtype=torch.int64)
    labels_from = CLASSES_FILE if from_file else "sorted folder names"
    source = (f"image folder {root} ({len(y)} images {list(x.shape[1:])}, {len(classes)} classes from "
              f"{labels_from})")
    return x, y, None, source, _folder_digest(root, [f for f, _ in files], from_file), classes


def _classes(root: Path) -> tuple[tuple[str, ...], bool]:
    """Class names in label order (classes.txt, else sorted folders), and whether classes.txt gave them."""
    folders = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    listing = root / CLASSES_FILE
    if not listing.is_file():
        if not folders:
            raise DataError(f"{root}: no class folders; put images in {root}/<class name>/")
        return tuple(folders), False
    names = [line.strip() for line in listing.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not names or len(set(names)) != len(names):
        raise DataError(f"{listing}: need one distinct class name a line, got {names}")
    stray = [d for d in folders if d not in names]
    if stray:
        raise DataError(f"{root / stray[0]}: folder not named in {CLASSES_FILE}")
    return tuple(names), True


def _images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)


def _check_images(root: Path, files: list[Path]) -> set[str]:
    """Every image readable, 8-bit, one size; their modes."""
    from PIL import Image, UnidentifiedImageError

    modes, first = set(), None
    for f in files:
        try:
            with Image.open(f) as im:
                size, mode = im.size, im.mode
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"{f}: not a readable image ({e})") from None
        if mode not in _GRAY_MODES + _COLOR_MODES:
            raise DataError(f"{f}: {mode} images are not supported; save 8-bit grayscale or RGB PNG/JPEG")
        if first is None:
            first = (f, size)
        elif size != first[1]:
            (w, h), (w0, h0) = size, first[1]
            raise DataError(f"{f}: {w}x{h} pixels, but {first[0]} is {w0}x{h0}; all images must have one "
                            "size")
        modes.add(mode)
    return modes


def _pixels(f: Path, channels: int) -> np.ndarray:
    """uint8 [C, H, W] (grayscale by ITU-R 601 luma when channels = 1)."""
    from PIL import Image

    with Image.open(f) as im:
        a = np.asarray(im.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _folder_digest(root: Path, files: list[Path], from_file: bool) -> str:
    """SHA-256 over (relative path, NUL, length, NUL, bytes) of classes.txt (if any) and of each image,
    in load order."""
    h = hashlib.sha256()
    for f in ([root / CLASSES_FILE] if from_file else []) + files:
        data = f.read_bytes()
        h.update(f"{f.relative_to(root).as_posix()}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


# ---- shared checks


def _read_bytes(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read {p}: {e.strerror or e}") from None


def _integer_labels(p: Path, y: np.ndarray, where: Callable[[int], str]) -> torch.Tensor:
    """int64 labels; DataError naming the first that is not a non-negative integer."""
    if np.issubdtype(y.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if len(bad):
            raise DataError(f"{p}: {where(bad[0])}: label {y[bad[0]]:g} is not an integer class id")
    bad = np.flatnonzero(y < 0)
    if len(bad):
        raise DataError(f"{p}: {where(bad[0])}: label {int(y[bad[0]])} is negative; class ids start at 0")
    return torch.from_numpy(y.astype(np.int64))


def _check_finite(p: Path, x: np.ndarray, where: Callable[[int, int], str]) -> None:
    """x [N, F]: DataError at the first NaN or infinity."""
    bad = np.argwhere(~np.isfinite(x))
    if len(bad):
        i, j = (int(v) for v in bad[0])
        raise DataError(f"{p}: {where(i, j)} is {x[i, j]}; features must be finite numbers "
                        f"({len(bad)} non-finite in all)")


def _task(p: Path, given: str | None, in_file: str | None) -> str:
    if in_file is not None and in_file not in TASKS:
        raise DataError(f"{p}: task must be 'multiclass' or 'binary', got {in_file!r}")
    if given is not None and in_file is not None and given != in_file:
        raise DataError(f"{p}: the file says task {in_file!r}, the run needs {given!r}")
    return given or in_file or "multiclass"


def _scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"scale must be a positive number (255 for 0..255 pixels), got {scale!r}")
    return x.to(torch.float32) / float(scale)


def _parse_shape(shape: str | Sequence[int]) -> tuple[int, ...]:
    """"1,28,28" or (1, 28, 28) -> (1, 28, 28); ConfigError unless positive integers."""
    try:
        dims = tuple(int(s) for s in (shape.split(",") if isinstance(shape, str) else shape))
    except (TypeError, ValueError):
        dims = ()
    if not dims or min(dims) < 1:
        raise ConfigError(f"shape must be positive integers like 1,28,28, got {shape!r}")
    return dims


def _reshaped(p: Path, x: torch.Tensor, shape: str | Sequence[int]) -> torch.Tensor:
    dims = _parse_shape(shape)
    have = math.prod(x.shape[1:])
    if math.prod(dims) != have:
        raise DataError(f"{p}: shape={','.join(map(str, dims))} holds {math.prod(dims)} values, "
                        f"examples have {have}")
    return x.reshape(len(x), *dims)


def _check(p: Path, site: SiteData, fmt: str, input_shape, flat: bool, n_classes: int | None,
           like: str | None) -> None:
    """Checks against the model: labels, input shape, value range."""
    y = site.y
    if site.task == "binary" and len(y) and int(y.max()) > 1:
        i = int(torch.nonzero(y > 1)[0])
        raise DataError(f"{p}: {_example(fmt, i)} has label {int(y[i])}; a binary task's labels are 0 or 1")
    if n_classes is not None and site.task == "multiclass":
        if site.classes is not None and len(site.classes) != n_classes:
            shown = ", ".join(site.classes[:5]) + (", ..." if len(site.classes) > 5 else "")
            raise DataError(f"{p}: {len(site.classes)} classes ({shown}), the model has {n_classes}; name "
                            f"the model's {n_classes} classes in {CLASSES_FILE}, one a line in label order")
        if len(y) and int(y.max()) >= n_classes:
            i = int(torch.nonzero(y >= n_classes)[0])
            raise DataError(f"{p}: {_example(fmt, i)} has label {int(y[i])}; the model has {n_classes} "
                            f"classes (labels 0..{n_classes - 1})")
    if input_shape is not None:
        check_input(site.x, input_shape, str(p), flat=flat)
    if like is not None and like in VALUE_RANGES:
        _check_range(p, site.x, like)


def _example(fmt: str, i: int) -> str:
    """Example i as the user finds it: a CSV row (from 1), an .npz index, the i+1-th image."""
    return {"csv": f"row {i + 1}", "npz": f"y[{i}]", "images": f"image {i + 1}"}[fmt]


def _check_range(p: Path, x: torch.Tensor, like: str) -> None:
    lo, hi = VALUE_RANGES[like]
    x_lo, x_hi = float(x.min()), float(x.max())
    if lo <= x_lo and x_hi <= hi:
        return
    pixels = 0 <= x_lo and x_hi <= 255 and bool((x == torch.round(x)).all())
    fix = "give scale=255 (0..255 pixels)" if pixels else f"rescale them to [{lo:g}, {hi:g}]"
    raise DataError(f"{p}: feature values span [{x_lo:g}, {x_hi:g}], {like} models take values in "
                    f"[{lo:g}, {hi:g}] (pixels / 255); {fix}")


# ---- writing


def write_site_data(
    path: str | os.PathLike,
    x: torch.Tensor,
    y: torch.Tensor,
    fmt: str,
    *,
    task: str = "multiclass",
    n_classes: int | None = None,
    label_column: str = "label",
) -> None:
    """Write examples x [N, ...] and labels y [N] as a site file that `load_site_data` reads back.

    csv: header `label,pixel1,...` (images) or `label,feature1,...`, labels as integers, features with
    9 significant digits (every float32 reads back exactly; give shape= to restore [C, H, W]).
    npz: x (float32, or integer ids), y int64, task. images: root/classes.txt naming 0..n_classes-1
    (default: the largest label + 1) and root/<label>/<index>.png, pixels round(x·255) (exact for
    8-bit data, see `is_8bit`); the folder must be new or empty. Files are overwritten.
    """
    p = Path(path)
    if fmt not in SITE_FORMATS:
        raise ConfigError(f"unknown site data format {fmt!r}; allowed: {', '.join(SITE_FORMATS)}")
    if task not in TASKS:
        raise ConfigError(f"task must be 'multiclass' or 'binary', got {task!r}")
    if fmt != "images" and p.suffix.lower() != f".{fmt}":
        raise DataError(f"{p}: a {fmt} file must end in .{fmt} (the loader goes by the suffix)")
    x, y = x.detach().cpu(), y.detach().cpu().to(torch.int64)
    if x.dtype.is_floating_point:
        x = x.to(torch.float32)
    if len(x) != len(y) or len(y) == 0 or int(y.min()) < 0:
        raise DataError(f"{p}: need as many labels (ids >= 0) as examples, at least one; got {len(y)} "
                        f"and {len(x)}")
    p.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        _write_csv(p, x, y, label_column)
    elif fmt == "npz":
        np.savez_compressed(p, x=x.numpy(), y=y.numpy(), task=np.array(task))
    else:
        _write_folder(p, x, y, int(y.max()) + 1 if n_classes is None else n_classes)


def is_8bit(x: torch.Tensor) -> bool:
    """True if every value is k/255 for an integer k in 0..255 (an image folder then holds x exactly)."""
    x = x.detach().cpu().to(torch.float32)
    return bool(((x >= 0) & (x <= 1)).all()) and torch.equal(torch.round(x * 255) / 255, x)


def _write_csv(p: Path, x: torch.Tensor, y: torch.Tensor, label_column: str) -> None:
    feats = x.reshape(len(x), -1).numpy().astype(np.float64)
    stem = "pixel" if x.ndim == 4 else "feature"
    header = ",".join([label_column, *(f"{stem}{k}" for k in range(1, feats.shape[1] + 1))])
    table = np.column_stack([y.numpy().astype(np.float64), feats])
    np.savetxt(p, table, fmt=["%d"] + ["%.9g"] * feats.shape[1], delimiter=",", header=header, comments="")


def _write_folder(root: Path, x: torch.Tensor, y: torch.Tensor, n_classes: int) -> None:
    from PIL import Image

    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise DataError(f"{root}: exists and is not an empty folder; an image folder is written only into "
                        "a new or empty one")
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{root}: images need examples [C, H, W] with C = 1 or 3, got {list(x.shape[1:])}")
    if not x.dtype.is_floating_point or float(x.min()) < 0 or float(x.max()) > 1:
        raise DataError(f"{root}: pixel values must be floats in [0, 1] to write images")
    if int(y.max()) >= n_classes:
        raise DataError(f"{root}: label {int(y.max())} but {n_classes} classes")
    names = [str(c) for c in range(n_classes)]
    for name in names:
        (root / name).mkdir(parents=True)
    (root / CLASSES_FILE).write_text("\n".join(names) + "\n", encoding="utf-8")
    pixels = np.rint(x.numpy() * np.float32(255)).astype(np.uint8)
    width = len(str(len(y) - 1))
    for i, (a, label) in enumerate(zip(pixels, y.tolist())):
        image = Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))
        image.save(root / names[label] / f"{i:0{width}d}.png")
