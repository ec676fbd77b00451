"""`dpfl classic train`: a DP classical model on a built-in data set or a CSV, beside scikit-learn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from dpfl.classic.tables import BUILTIN, Table, load_csv, load_table
from dpfl.errors import ConfigError, DataError, DpflError
from dpfl.stats.inputs import check_epsilon

app = typer.Typer(help="DP classical models (functional mechanism, DP-SVM, DP random forest).", no_args_is_help=True)

MODELS = {
    "linear": "functional-mechanism linear regression",
    "logistic": "functional-mechanism logistic regression",
    "svm": "DP linear SVM (output perturbation)",
    "forest": "DP random forest",
}


@app.callback()
def _group() -> None:
    """DP classical models (functional mechanism, DP-SVM, DP random forest)."""


def fail(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


def _bounds(table: Table, names: list[str], path: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """Public per-column (lo, hi): from a bounds CSV (header + lower row + upper row) or the data."""
    if path is None:
        cols = np.column_stack([table.numeric(n) for n in names])
        lo, hi = cols.min(0), cols.max(0)
    else:
        b = load_csv(path)
        if b.n_rows != 2:
            raise DataError(f"{path}: a bounds file has a header and exactly two rows (lower, upper), got {b.n_rows}")
        missing = [n for n in names if n not in b.columns]
        if missing:
            raise DataError(f"{path} gives no bounds for {missing}")
        vals = np.array([b.numeric(n) for n in names])
        lo, hi = vals[:, 0], vals[:, 1]
        if np.any(lo >= hi):
            raise DataError(f"{path}: lower bound >= upper bound for {[n for n, a, z in zip(names, lo, hi) if a >= z]}")
    return lo, np.where(hi > lo, hi, lo + 1.0)  # a constant column gets a unit range


def _baseline(model: str, trees: int, depth: int):
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    return {
        "linear": lambda: LinearRegression(),
        "logistic": lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
        "svm": lambda: make_pipeline(StandardScaler(), LinearSVC()),
        "forest": lambda: RandomForestClassifier(trees, max_depth=depth, random_state=0),
    }[model]()


def _dp_model(model: str, eps: float, bounds, y_bounds, trees: int, depth: int, c: float, seed):
    from dpfl.classic import DPSVM, DPRandomForest, FunctionalLinearRegression, FunctionalLogisticRegression

    if model == "linear":
        return FunctionalLinearRegression(eps, bounds=bounds, y_bounds=y_bounds, random_state=seed)
    if model == "logistic":
        return FunctionalLogisticRegression(eps, bounds=bounds, random_state=seed)
    if model == "svm":
        return DPSVM(eps, C=c, bounds=bounds, random_state=seed)
    return DPRandomForest(eps, bounds=bounds, n_trees=trees, max_depth=depth, random_state=seed)


def train_and_compare(
    model: str, epsilon: float, data: str | None = None, target: str | None = None, bounds: Path | None = None,
    trees: int | None = None, depth: int | None = None, c: float | None = None, test_size: float = 0.3,
    seed: int | None = None,
) -> dict:
    """Fit the DP model and its non-private scikit-learn counterpart on one split; the numbers."""
    from sklearn.model_selection import train_test_split

    from dpfl.stats.ledger import pure_epsilon

    if model not in MODELS:
        raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")
    for flag, value, owner in (("--trees", trees, "forest"), ("--depth", depth, "forest"), ("--C", c, "svm")):
        if value is not None and model != owner:
            raise ConfigError(f"{flag} applies to --model {owner} only")
    eps = check_epsilon(epsilon, "--epsilon")
    if seed is not None and not 0 <= seed < 2**32:
        raise ConfigError(f"--seed must lie in [0, 2**32), got {seed}")
    if not 0 < test_size < 1:
        raise ConfigError(f"--test-size must lie strictly between 0 and 1, got {test_size}")
    data = data or ("diabetes" if model == "linear" else "breast_cancer")
    table = load_table(data)
    if table.builtin and target is not None:
        raise ConfigError(f"--target applies to a CSV file; {data}'s target is fixed")
    target = table.target if table.builtin else (target or list(table.columns)[-1])
    table.column(target)
    task = BUILTIN[data][1] if table.builtin else None
    if task == "regression" and model != "linear":
        raise ConfigError(f"{data} is a regression data set: use --model linear")
    if task == "classification" and model == "linear":
        raise ConfigError(f"{data} is a classification data set: use --model logistic, svm or forest")
    features = [n for n in table.columns if n != target]
    if not features:
        raise DataError(f"{data} has no feature column besides the target {target!r}")
    try:
        X = np.column_stack([table.numeric(f) for f in features])
    except DataError as e:
        raise DataError(f"{e} (every column but the target {target!r} must be numeric; see --target)") from None
    y = table.numeric(target) if model == "linear" else table.column(target)
    classes = np.unique(y)
    if model in ("logistic", "svm") and classes.size != 2:
        raise DataError(f"--model {model} is a binary classifier; {target!r} has {classes.size} classes "
                        "(use --model forest)")
    trees, depth, c = 10 if trees is None else trees, 4 if depth is None else depth, 1.0 if c is None else c
    lo, hi = _bounds(table, features, bounds)
    y_bounds = tuple(float(v[0]) for v in _bounds(table, [target], bounds)) if model == "linear" else None
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=test_size, random_state=0 if seed is None else seed)
    dp = _dp_model(model, eps, (lo, hi), y_bounds, trees, depth, c, seed).fit(Xtr, ytr)
    base = _baseline(model, trees, depth).fit(Xtr, ytr)
    if model == "linear":
        metric, score = "MSE", lambda m: float(np.mean((m.predict(Xte) - yte) ** 2))
    else:
        metric, score = "accuracy", lambda m: float(np.mean(m.predict(Xte) == yte))
    return {
        "model": model, "data": data, "target": target, "n_train": len(ytr), "n_test": len(yte),
        "n_features": len(features), "classes": None if model == "linear" else int(classes.size),
        "metric": metric, "dp": score(dp), "non_private": score(base), "epsilon": eps,
        "epsilon_spent": pure_epsilon(dp.ledger_), "bounds_from_data": bounds is None,
        "baseline": type(base[-1] if hasattr(base, "steps") else base).__name__,
    }


@app.command()
def train(
    model: str = typer.Option(..., "--model", help="linear | logistic (functional mechanism), svm, forest"),
    epsilon: float = typer.Option(..., "--epsilon", help="privacy budget ε (> 0); the model is ε-DP"),
    data: str = typer.Option(None, "--data", help=f"{' | '.join(BUILTIN)} or a CSV file with a header "
                                                  "(default: diabetes for linear, breast_cancer otherwise)"),
    target: str = typer.Option(None, "--target", help="CSV only: the label column (default: the last one)"),
    bounds: Path = typer.Option(None, "--bounds", help="CSV of public bounds: the header's column names, "
                                                       "a lower row, an upper row (default: the data's range)"),
    trees: int = typer.Option(None, "--trees", help="forest only: number of trees (default 10)"),
    depth: int = typer.Option(None, "--depth", help="forest only: depth of every tree (default 4)"),
    c: float = typer.Option(None, "--C", help="svm only: soft-margin C (default 1)"),
    test_size: float = typer.Option(0.3, "--test-size", help="held-out fraction"),
    seed: int = typer.Option(None, "--seed", help="seed of the split and the noise (default: split 0, noise "
                                                  "from the OS)"),
) -> None:
    """Train a DP model and the non-private scikit-learn model on the same split; print both scores."""
    try:
        r = train_and_compare(model, epsilon, data, target, bounds, trees, depth, c, test_size, seed)
    except DpflError as e:
        fail(e)
    classes = f", {r['classes']} classes" if r["classes"] else ""
    typer.echo(f"data: {r['data']} ({r['n_features']} features{classes}), {r['n_train']} train / "
               f"{r['n_test']} test rows, target {r['target']!r}")
    typer.echo(f"{MODELS[model]:52s} {r['metric']} {r['dp']:.4f}")
    typer.echo(f"{'non-private (scikit-learn ' + r['baseline'] + ')':52s} {r['metric']} {r['non_private']:.4f}")
    typer.echo(f"ε spent: {r['epsilon_spent']:.6g} (ε-DP, replace-one neighbours; summed from the privacy ledger)")
    if r["bounds_from_data"]:
        typer.echo("note: feature ranges were read from the data and treated as public; with real private "
                   "data pass --bounds")
