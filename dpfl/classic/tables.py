"""Tables for the `dpfl classic` / `dpfl stats` commands: scikit-learn's bundled data sets or a CSV.

A CSV needs a header row; cells stay text until a command asks for a number, so a text column
is fine for a histogram of categories and an error (naming the column and row) for a mean.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpfl.errors import DataError

# name -> (scikit-learn loader, task); the target column is called "target"
BUILTIN = {
    "breast_cancer": ("load_breast_cancer", "classification"),
    "diabetes": ("load_diabetes", "regression"),
    "digits": ("load_digits", "classification"),
    "wine": ("load_wine", "classification"),
}


@dataclass
class Table:
    name: str
    columns: dict[str, np.ndarray]  # name -> float64 (built-in) or str (CSV) values, one per row
    target: str | None = None  # a built-in data set's target column
    builtin: bool = False

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.columns.values())))

    def column(self, name: str) -> np.ndarray:
        if name not in self.columns:
            shown = ", ".join(list(self.columns)[:12]) + (", ..." if len(self.columns) > 12 else "")
            raise DataError(f"{self.name} has no column {name!r}; its columns are {shown}")
        return self.columns[name]

    def numeric(self, name: str) -> np.ndarray:
        """The column as finite float64 values, or one DataError naming the first bad cell."""
        col = self.column(name)
        if col.dtype.kind == "f":
            out = col
        else:
            out = np.empty(col.shape[0])
            for i, cell in enumerate(col):
                try:
                    out[i] = float(cell)
                except ValueError:
                    raise DataError(f"column {name!r} is not numeric: row {i + 1} holds {str(cell)!r}") from None
        bad = np.flatnonzero(~np.isfinite(out))
        if bad.size:
            raise DataError(f"column {name!r} has a non-finite value at row {bad[0] + 1} ({str(col[bad[0]])!r})")
        return out


def load_builtin(name: str) -> Table:
    import sklearn.datasets

    loader, _ = BUILTIN[name]
    kwargs = {"scaled": False} if name == "diabetes" else {}  # raw units: age in years, bmi, ...
    bunch = getattr(sklearn.datasets, loader)(**kwargs)
    names = [str(f) for f in bunch.feature_names]
    cols = {f: np.asarray(bunch.data[:, j], dtype=np.float64) for j, f in enumerate(names)}
    cols["target"] = np.asarray(bunch.target, dtype=np.float64)
    return Table(name, cols, target="target", builtin=True)


def load_csv(path: Path) -> Table:
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {path} as CSV: {e}") from None
    if not rows or not rows[0]:
        raise DataError(f"{path} is empty; it needs a header row and data rows")
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header) or "" in header:
        raise DataError(f"{path}: the header must name every column once, got {header}")
    body = [r for r in rows[1:] if r]
    if not body:
        raise DataError(f"{path} has a header but no data rows")
    for i, r in enumerate(body):
        if len(r) != len(header):
            raise DataError(f"{path}: row {i + 1} has {len(r)} cells, the header names {len(header)}")
    cells = np.array([[c.strip() for c in r] for r in body], dtype=str)
    return Table(str(path), {h: cells[:, j] for j, h in enumerate(header)})


def load_table(data: str) -> Table:
    """A built-in data set by name, or a CSV file by path."""
    if data in BUILTIN:
        return load_builtin(data)
    if not data.lower().endswith(".csv"):
        raise DataError(f"--data must be a CSV file or one of {sorted(BUILTIN)}, got {data!r}")
    return load_csv(Path(data))
