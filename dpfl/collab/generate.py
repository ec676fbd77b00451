"""Private dataset generation (FedCollabNN §V): worker models as PATE teachers.

1. train K workers with FedCollabNN (Alg. 2) on disjoint shards (or independently: plain PATE);
2. take `n_public` unlabeled inputs (a seeded part of the test split; the rest evaluates);
3. every worker votes; the aggregator releases noisy-max labels (LNMax Lap(1/γ), GNMax, or
   Confident-GNMax, which leaves out the queries whose noisy max vote is below its threshold);
4. write the labelled set (NPZ and CSV) and a privacy report (data-independent and
   data-dependent ε at δ, the latter released by smooth sensitivity);
5. optionally train a student on it (post-processing: no extra privacy cost).

Each training record is in one shard and, under Alg. 2, only moves its own worker's model
(the opened loss scalars carry no gradient), so one record changes at most one vote per
query: PATE's sensitivity argument applies. The opened aggregate losses themselves are
released without noise during training and are not covered by ε.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dpfl.collab.config import ExperimentConfig
from dpfl.collab.experiment import load_data, make_workers
from dpfl.collab.fedcollab import predict_logits, train_losses
from dpfl.errors import ConfigError
from dpfl.models import build_model
from dpfl.pate.analysis import GaussianOptions, analyze
from dpfl.pate.votes import UNANSWERED, confident_gnmax, noisy_max, vote_counts
from dpfl.rng import CryptoRNG, Seeds


def train_student(
    cfg: ExperimentConfig, x: torch.Tensor, y: torch.Tensor, x_eval: torch.Tensor, y_eval: torch.Tensor
) -> float:
    g = cfg.generate
    seeds = Seeds(cfg.seed)
    model = build_model(g.student_model, seed=seeds.seed("generate", "student") % 2**32, **g.student_options)
    opt = torch.optim.SGD(model.parameters(), lr=g.student_lr)
    for epoch in range(g.student_epochs):
        perm = torch.randperm(len(y), generator=seeds.torch("generate", "student", epoch))
        for i in range(0, len(y), g.student_batch_size):
            idx = perm[i : i + g.student_batch_size]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return (
        float((predict_logits(model, x_eval).argmax(1) == y_eval).float().mean())
        if len(y_eval)
        else float("nan")
    )


def write_csv(path: Path, index: np.ndarray, labels: np.ndarray, x: np.ndarray | None) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        feats = [] if x is None else [f"x{i}" for i in range(x.shape[1])]
        w.writerow(["index", "label", *feats])
        for r in range(len(labels)):
            row = [int(index[r]), int(labels[r])]
            if x is not None:
                row += [f"{v:.6g}" for v in x[r]]
            w.writerow(row)


def _mean(a: np.ndarray) -> float:
    return float(np.mean(a)) if len(a) else float("nan")


def generate_dataset(cfg: ExperimentConfig, out_dir: str | Path | None = None) -> dict:
    """Run the whole pipeline; returns the privacy report (also written as privacy_report.json)."""
    g = cfg.generate
    if g is None:
        raise ConfigError("the config has no [generate] section")
    c = cfg.collab
    seeds = Seeds(cfg.seed)
    ds = load_data(cfg)
    if g.n_public >= ds.n_test:
        raise ConfigError(
            f"n_public must be < the test split ({ds.n_test}): the rest evaluates; got {g.n_public}"
        )
    workers = make_workers(cfg, ds, g.workers)
    weight = 1.0 if c.mode == "sum" else 1.0 / g.workers
    fedcollab = g.teachers == "fedcollab"
    log = train_losses(
        workers,
        combine=c.mode if fedcollab else "independent",
        epochs=c.epochs,
        batch_size=c.batch_size,
        lr=c.lr if fedcollab else c.lr * weight,
        seeds=seeds,
        frac_bits=c.frac_bits,
    )
    perm = torch.randperm(ds.n_test, generator=seeds.torch("generate", "public"))
    pub, rest = perm[: g.n_public], perm[g.n_public :]
    x_pub = ds.x_test[pub]
    preds = np.stack([predict_logits(w.model, x_pub).argmax(1).numpy() for w in workers])  # [teachers, Q]
    counts = vote_counts(preds, ds.num_classes)
    rng = CryptoRNG() if g.os_randomness else seeds.crypto("generate", "votes")
    if g.mechanism == "confident-gnmax":
        labels = confident_gnmax(counts, g.threshold, g.sigma1, g.noise, rng)
    else:
        labels = noisy_max(counts, g.mechanism, g.noise, rng)
    release_rng = CryptoRNG() if g.os_randomness else seeds.crypto("generate", "release")
    gauss = GaussianOptions(g.threshold, g.sigma1, g.threshold_data_independent, g.order, None, g.ss_sigma)
    rep = analyze(
        counts,
        labels=labels,
        mechanism=g.mechanism,
        noise=g.noise,
        delta=g.delta,
        moments=g.moments,
        beta=g.beta,
        rng=release_rng,
        gauss=gauss,
    )
    keep = labels != UNANSWERED  # Confident-GNMax: only answered queries become data
    pub, labels, counts = pub[torch.from_numpy(keep)], labels[keep], counts[keep]
    x_pub = ds.x_test[pub]
    y_true = ds.y_test[pub].numpy()
    report = {
        "privacy": rep.to_dict(),
        "teachers": g.workers,
        "teacher_training": (
            f"FedCollabNN Alg. 2 ({c.mode})" if fedcollab else f"independent, lr {c.lr * weight:g}"
        )
        + f", {c.epochs} epochs, disjoint equal shards",
        "queries": g.n_public,
        "answered": len(labels),
        # evaluation only (needs the true labels), over the answered queries
        "label_accuracy": _mean(labels == y_true),
        "plurality_accuracy": _mean(counts.argmax(1) == y_true),
        "teacher_accuracy": [_mean(p[keep] == y_true) for p in preds],
        "training_opened_losses": log.opened_values,
        "index": "rows of the dataset's test split as loaded (dataset, seed, n_test)",
        "caveats": [
            "ε covers the released labels; the aggregate losses opened during training are not noised",
            "sensitivity 1 vote per query assumes each record trains one teacher (disjoint shards, Alg. 2)",
            "eps_data_dependent is raw (data-dependent); publish eps_data_dependent_released instead",
        ],
    }
    if g.student_model and len(labels):
        report["student_model"] = g.student_model
        report["student_test_accuracy"] = train_student(
            cfg, x_pub, torch.from_numpy(labels), ds.x_test[rest], ds.y_test[rest]
        )
        report["student_eval_examples"] = len(rest)
    out = Path(out_dir if out_dir is not None else g.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x_np = x_pub.numpy()
    np.savez_compressed(out / "dataset.npz", x=x_np, y=labels.astype(np.int64), index=pub.numpy())
    write_csv(
        out / "dataset.csv",
        pub.numpy(),
        labels,
        x_np.reshape(len(x_np), int(np.prod(x_np.shape[1:]))) if g.csv_features else None,
    )
    (out / "privacy_report.json").write_text(json.dumps(report, indent=2))
    report["files"] = [str(out / n) for n in ("dataset.npz", "dataset.csv", "privacy_report.json")]
    return report
