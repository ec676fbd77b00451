"""The FedCollabNN experiment: K workers on equal random shards, Alg. 2 vs both baselines."""

from __future__ import annotations

import time

import torch

from dpfl.collab.config import ExperimentConfig
from dpfl.collab.fedcollab import Worker, evaluate, train_fedavg, train_losses
from dpfl.data import load_dataset, partition
from dpfl.models import build_model
from dpfl.rng import Seeds


def load_data(cfg: ExperimentConfig):
    d = cfg.data
    return load_dataset(d.dataset, seed=cfg.seed, n_train=d.n_train, n_test=d.n_test, **d.options)


def shards(cfg: ExperimentConfig, ds, k: int) -> list:
    return partition(ds.y_train, k, "shards", seed=Seeds(cfg.seed).seed("collab", "split", k))


def make_workers(cfg: ExperimentConfig, ds, k: int) -> list[Worker]:
    """K workers on equal random shards of the training set; worker i's model is
    models[i % len(models)], initialised from its own seed (same seed → same start in every run)."""
    seeds = Seeds(cfg.seed)
    parts = shards(cfg, ds, k)
    specs = cfg.collab.models
    workers = []
    for i, p in enumerate(parts):
        spec = specs[i % len(specs)]
        name, opts = (spec, cfg.collab.model_options) if isinstance(spec, str) else (spec.name, spec.options)
        model = build_model(name, seed=seeds.seed("collab", "init", k, i) % 2**32, **opts).to(
            cfg.collab.device
        )
        idx = torch.from_numpy(p)
        workers.append(
            Worker(model, ds.x_train[idx].to(cfg.collab.device), ds.y_train[idx].to(cfg.collab.device))
        )
    return workers


def run_workers(cfg: ExperimentConfig, ds, k: int, log=None) -> dict:
    """Run the configured algorithms with K workers; per-epoch accuracies and traffic."""
    c = cfg.collab
    seeds = Seeds(cfg.seed)
    out: dict = {"workers": k, "train_per_worker": ds.n_train // k}

    def on_epoch(alg):
        return lambda epoch, models: evaluate(
            models, ds.x_test, ds.y_test, vote_gamma=c.vote_gamma, rng_seeds=seeds, tag=(k, alg, epoch)
        )

    weight = 1.0 if c.mode == "sum" else 1.0 / k
    logs = {}
    common = {"epochs": c.epochs, "batch_size": c.batch_size, "seeds": seeds}
    if "fedcollab" in c.algorithms:
        t = time.perf_counter()
        logs["fedcollab"] = train_losses(
            make_workers(cfg, ds, k),
            combine=c.mode,
            lr=c.lr,
            frac_bits=c.frac_bits,
            on_epoch=on_epoch("fedcollab"),
            **common,
        )
        out["fedcollab_seconds"] = time.perf_counter() - t
    if "independent" in c.algorithms:
        logs["independent"] = train_losses(
            make_workers(cfg, ds, k),
            combine="independent",
            lr=c.lr * weight,
            on_epoch=on_epoch("independent"),
            **common,
        )
    if "fedavg" in c.algorithms:
        logs["fedavg"] = train_fedavg(
            make_workers(cfg, ds, k),
            lr=c.lr,
            sync_every=c.fedavg_sync_every,
            frac_bits=c.frac_bits,
            on_epoch=on_epoch("fedavg"),
            **common,
        )
    for name, alg_log in logs.items():
        out[name] = alg_log.summary()
        if log is not None:
            hist = out[name]["history"][-1] if out[name].get("history") else {}
            acc = hist.get("worker_accuracy") or []
            log(f"K = {k:>3} {name:<12} final mean worker accuracy "
                f"{sum(acc) / len(acc) if acc else float('nan'):.4f}")
    if "fedcollab" in logs and "independent" in logs:
        # B1.5: Alg. 2 equals independent training with lr·w up to float rounding.
        diffs = [
            float((a - b).abs().max())
            for a, b in zip(logs["fedcollab"].final_params, logs["independent"].final_params, strict=True)
        ]
        scale = max(float(a.abs().max()) for a in logs["fedcollab"].final_params)
        out["max_param_diff_fedcollab_vs_independent"] = max(diffs)
        out["param_scale"] = scale
    out["steps_per_epoch"] = -(-max(len(p) for p in shards(cfg, ds, k)) // c.batch_size)
    return out


def run_experiment(cfg: ExperimentConfig, log=None) -> dict:
    """log: optional callable taking one progress line per (K, algorithm)."""
    ds = load_data(cfg)
    return {
        "config": cfg.model_dump(),
        "dataset": ds.name,
        "n_train": ds.n_train,
        "n_test": ds.n_test,
        "runs": [run_workers(cfg, ds, k, log) for k in cfg.collab.workers],
    }
