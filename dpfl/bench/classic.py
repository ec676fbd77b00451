"""`run_bench`: measured utility vs ε of the DP classifiers on scikit-learn's bundled data sets,
next to a non-private baseline (mean over seeds; 70/30 split; public bounds = the data's range)."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from dpfl.classic import DPSVM, DPRandomForest, FunctionalLinearRegression, FunctionalLogisticRegression


def _split(loader):
    X, y = loader(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=0)
    return Xtr, Xte, ytr, yte, (X.min(0), X.max(0)), (float(y.min()), float(y.max()))


def run_bench(epsilons=(0.1, 1.0, 10.0, 100.0, 1000.0), seeds: int = 5, console: Console | None = None) -> dict:
    """Accuracy (classifiers) or test MSE (linear regression) per ε; prints a rich table."""
    t0 = time.time()
    cancer, wine, diabetes = _split(load_breast_cancer), _split(load_wine), _split(load_diabetes)
    acc = lambda m, d: float((m.predict(d[1]) == d[3]).mean())
    mse = lambda m, d: float(np.mean((m.predict(d[1]) - d[3]) ** 2))
    rows = {
        "FM logistic / breast_cancer (acc)": (
            cancer, acc, lambda e, s, d: FunctionalLogisticRegression(e, bounds=d[4], random_state=s),
            make_pipeline(StandardScaler(), LogisticRegression())),
        "FM linear uniform / diabetes (MSE)": (
            diabetes, mse, lambda e, s, d: FunctionalLinearRegression(e, bounds=d[4], y_bounds=d[5], random_state=s),
            LinearRegression()),
        "FM linear relevance / diabetes (MSE)": (
            diabetes, mse, lambda e, s, d: FunctionalLinearRegression(e, bounds=d[4], y_bounds=d[5],
                                                                      budget_split="relevance", random_state=s),
            LinearRegression()),
        "DP SVM / breast_cancer (acc)": (
            cancer, acc, lambda e, s, d: DPSVM(e, bounds=d[4], random_state=s),
            make_pipeline(StandardScaler(), LinearSVC())),
        "DP forest / breast_cancer (acc)": (
            cancer, acc, lambda e, s, d: DPRandomForest(e, bounds=d[4], random_state=s),
            RandomForestClassifier(10, max_depth=4, random_state=0)),
        "DP forest / wine (acc)": (
            wine, acc, lambda e, s, d: DPRandomForest(e, bounds=d[4], random_state=s),
            RandomForestClassifier(10, max_depth=4, random_state=0)),
    }
    out: dict = {"epsilons": list(epsilons), "seeds": seeds, "results": {}}
    table = Table(title=f"DP classical ML: utility vs ε (mean of {seeds} seeds)")
    table.add_column("model / data (metric)")
    table.add_column("non-private", justify="right")
    for e in epsilons:
        table.add_column(f"ε={e:g}", justify="right")
    for name, (data, metric, make, baseline) in rows.items():
        base = metric(baseline.fit(data[0], data[2]), data)
        vals = [float(np.mean([metric(make(e, s, data).fit(data[0], data[2]), data) for s in range(seeds)]))
                for e in epsilons]
        out["results"][name] = {"non_private": base, "dp": dict(zip(map(str, epsilons), vals))}
        fmt = (lambda v: f"{v:.0f}") if "MSE" in name else (lambda v: f"{v:.3f}")
        table.add_row(name, fmt(base), *map(fmt, vals))
    out["seconds"] = time.time() - t0
    (console or Console()).print(table)
    return out
