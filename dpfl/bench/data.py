"""`run_bench`: measured load / generation / partition times, and a logistic-regression baseline
on the synthetic medical data (how hard the task is)."""

from __future__ import annotations

import time

import numpy as np
from rich.console import Console
from rich.table import Table

from dpfl.data import load_dataset, partition
from dpfl.errors import DataError


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_bench(scale: float = 0.01, root=None, seed: int = 0) -> dict:
    """Time the loaders and partitioners; fit a baseline on medical-synthetic at `scale`."""
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    res: dict = {}
    try:
        fm, res["fashion_mnist_load_s"] = _timed(lambda: load_dataset("fashion-mnist", root=root))
        labels = fm.y_train.numpy()
    except DataError:
        res["fashion_mnist_load_s"] = None
        labels = np.repeat(np.arange(10), 6000)
    _, res["shards_60k_6000_s"] = _timed(lambda: partition(labels, 6000, "shards", seed=seed))
    _, res["dirichlet_60k_1000_s"] = _timed(
        lambda: partition(labels, 1000, "dirichlet", seed=seed, alpha=0.5)
    )
    _, res["imdb_synthetic_25k_25k_s"] = _timed(lambda: load_dataset("imdb-synthetic", seed=seed))

    med, res["medical_gen_s"] = _timed(lambda: load_dataset("medical-synthetic", seed=seed, scale=scale))
    n = med.n_train + med.n_test
    res.update(
        medical_scale=scale,
        medical_patients=n,
        medical_patients_per_s=n / res["medical_gen_s"],
        medical_hospitals=len(med.client_indices),
        medical_train_positive_rate=float(med.y_train.float().mean()),
    )
    x, xt = csr_matrix(med.x_train.float().numpy()), csr_matrix(med.x_test.float().numpy())
    y, yt = med.y_train.numpy(), med.y_test.numpy()
    clf = LogisticRegression(C=0.05, max_iter=300, class_weight="balanced", solver="liblinear").fit(x, y)
    score = clf.decision_function(xt)
    res["medical_logreg_auroc"] = float(roc_auc_score(yt, score))
    res["medical_logreg_balanced_accuracy"] = float(balanced_accuracy_score(yt, score > 0))

    t = Table("measure", "value", title="dpfl.data benchmark (measured)")
    for k, v in res.items():
        t.add_row(k, "not found" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
    Console().print(t)
    return res
