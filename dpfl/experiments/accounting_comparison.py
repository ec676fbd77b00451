"""Accuracy loss and membership advantage vs ε under five accountings (after Jayaraman & Evans 2019,
survey §5.2, Figs 5.2 / 5.3).

Logistic regression and a 2 x 256 ReLU MLP are trained with gradient perturbation (per-example
clipping to C, Gaussian noise σC on each batch sum, Adam) at the same target (ε, δ); only the
accounting that turns (ε, δ) into σ differs:

- ``nc``   naive composition over epochs: each epoch (ε/E, δ/E);
- ``ac``   advanced composition over epochs (Dwork-Rothblum-Vadhan, δ' = δ/2, per-epoch δ/(2E));
- ``zcdp`` each epoch ρ = 1/(2σ²), E ρ converted with Bun-Steinke Prop. 1.3;
- ``rdp``  Poisson-subsampled Gaussian, q = B/N, T = E N / B steps, RDP accountant;
- ``pld``  the same mechanism, privacy-loss-distribution accountant.

For nc/ac/zcdp an epoch is one Gaussian mechanism of sensitivity C (each record is in one batch
of a shuffled pass; the batches compose in parallel), calibrated with the analytic Gaussian
mechanism (Balle-Wang), valid for every ε; J&E used the classic formula, which is only a
proof for per-epoch ε < 1. rdp/pld train with Poisson sampling, which is what they account
(J&E shuffled for all four). Neighbours: add/remove one record.

Metrics: accuracy loss = 1 - acc_private / acc_non_private on the test set (survey eq. 5.1);
membership advantage (Yeom et al. 2018 loss-threshold attack: "member" iff the loss is below
the mean training loss) = TPR - FPR with the training set as members and an equal number of
test records as non-members.

Data deviation: the survey's CIFAR-100 (10k/10k, 100 classes) is not available here; Fashion-MNIST
(10 classes, 784 features) with the same 10k/10k split is used. All randomness (sampling, noise)
comes from `CryptoRNG` keyed by the seed.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import optimize
from torch import nn

from dpfl.dpsgd.core import clipped_grad_sum, noisy_gradient
from dpfl.errors import ConfigError
from dpfl.privacy.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    calibrate_sigma,
    epsilon_for,
)
from dpfl.privacy.composition import (
    advanced_composition,
    basic_composition,
    dp_to_zcdp,
    gaussian_zcdp,
    zcdp_to_dp,
)
from dpfl.rng import Seeds

METHODS = ("nc", "ac", "zcdp", "rdp", "pld")
MODELS = ("lr", "nn")
LABELS = {"nc": "naive composition", "ac": "advanced composition", "zcdp": "zCDP", "rdp": "RDP", "pld": "PLD"}


@dataclass
class Config:
    n_train: int = 10_000
    n_test: int = 10_000
    epochs: int = 100
    batch_size: int = 200
    lr: float = 0.01
    clip: float = 1.0
    delta: float = 1e-5
    epsilons: tuple[float, ...] = (0.1, 0.5, 1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0)
    methods: tuple[str, ...] = METHODS
    models: tuple[str, ...] = MODELS
    hidden: int = 256
    l2: dict = field(default_factory=lambda: {"lr": 1e-5, "nn": 1e-4})
    repeats: int = 1
    seed: int = 0
    data_root: str | None = None

    def check(self) -> None:
        bad_m = [m for m in self.methods if m not in METHODS]
        bad_n = [m for m in self.models if m not in MODELS]
        if bad_m or bad_n:
            raise ConfigError(f"unknown methods {bad_m} (allowed {METHODS}) or models {bad_n} (allowed {MODELS})")
        if min(self.n_train, self.n_test, self.epochs, self.batch_size, self.repeats) < 1:
            raise ConfigError("n_train, n_test, epochs, batch_size and repeats must all be >= 1")
        if self.batch_size > self.n_train:
            raise ConfigError(f"batch_size {self.batch_size} exceeds n_train {self.n_train}")
        if not all(e > 0 for e in self.epsilons) or not 0 < self.delta < 1:
            raise ConfigError(f"epsilons must be > 0 and delta in (0, 1), got {self.epsilons}, {self.delta}")


# ---- calibration: σ for a target (ε, δ) under each accounting ---------------------------------


def _solve_increasing(f, target: float, lo: float = 1e-8, hi: float = 1.0) -> float:
    """Largest x in [lo, hi] with f(x) <= target, f increasing (bisection on a log scale)."""
    if f(lo) > target:
        raise ConfigError(f"target {target} is below f({lo}) = {f(lo)}")
    while f(hi) <= target:
        hi *= 2
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) <= target else (lo, mid)
        if hi / lo < 1 + 1e-12:
            break
    return lo


def noise_multiplier(method: str, epsilon: float, delta: float, epochs: int, n: int, batch: int) -> float:
    """σ (std of the noise / C) that reaches (ε, δ) under `method`."""
    E = epochs
    if method == "nc":
        return analytic_gaussian_sigma(epsilon / E, delta / E)
    if method == "ac":
        d0, dp = delta / (2 * E), delta / 2
        eps0 = _solve_increasing(lambda e: advanced_composition(e, d0, E, dp)[0], epsilon)
        return analytic_gaussian_sigma(eps0, d0)
    if method == "zcdp":
        return math.sqrt(E / (2 * dp_to_zcdp(epsilon, delta)))
    if method in ("rdp", "pld"):
        q, steps = batch / n, E * math.ceil(n / batch)
        return calibrate_sigma(epsilon, delta, q, steps, accountant=method)
    raise ConfigError(f"method must be one of {METHODS}, got {method!r}")


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Smallest ε at which the Gaussian mechanism (noise σ, sensitivity 1) is (ε, δ)-DP (exact)."""
    f = lambda e: analytic_gaussian_delta(sigma, e) - delta
    if f(0.0) <= 0:
        return 0.0
    hi = 1.0
    while f(hi) > 0:
        hi *= 2
    return optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-12)


def achieved_epsilon(method: str, sigma: float, delta: float, epochs: int, n: int, batch: int) -> float:
    """ε that `method`'s own theorem certifies for σ (a check on the calibration)."""
    E = epochs
    if method == "nc":
        return basic_composition(gaussian_epsilon(sigma, delta / E), delta / E, E)[0]
    if method == "ac":
        d0 = delta / (2 * E)
        return advanced_composition(gaussian_epsilon(sigma, d0), d0, E, delta / 2)[0]
    if method == "zcdp":
        return zcdp_to_dp(E * gaussian_zcdp(sigma), delta)
    return epsilon_for(sigma, batch / n, E * math.ceil(n / batch), delta, accountant=method)


# ---- models, training, attack ---------------------------------------------------------------


def make_model(kind: str, d: int, k: int, hidden: int) -> nn.Module:
    if kind == "lr":
        return nn.Linear(d, k)
    return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, k))


def train(kind: str, x: torch.Tensor, y: torch.Tensor, k: int, cfg: Config, sigma: float | None,
          sampling: str, seeds: Seeds) -> nn.Module:
    """sigma=None: non-private (no clipping). sampling: 'shuffle' (epoch passes) or 'poisson'."""
    with torch.random.fork_rng():  # reproducible initial weights without touching the global stream
        torch.manual_seed(seeds.seed("init"))
        model = make_model(kind, x.shape[1], k, cfg.hidden)
    params = dict(model.named_parameters())
    opt = torch.optim.Adam(params.values(), lr=cfg.lr)
    rng = seeds.crypto("dpsgd")
    n, B = x.shape[0], cfg.batch_size
    steps_per_epoch = math.ceil(n / B)
    for epoch in range(cfg.epochs):
        order = np.argsort(rng.uniform(n)) if sampling == "shuffle" else None
        for s in range(steps_per_epoch):
            idx = order[s * B : (s + 1) * B] if order is not None else np.flatnonzero(rng.uniform(n) < B / n)
            idx_t = torch.from_numpy(idx)
            if sigma is None:
                opt.zero_grad()
                F.cross_entropy(model(x[idx_t]), y[idx_t]).backward()
                grads = {name: p.grad for name, p in params.items()}
            else:
                detached = {name: p.detach() for name, p in params.items()}
                if idx.size:
                    gsum = clipped_grad_sum(detached, {}, model, x[idx_t], y[idx_t], clip=cfg.clip)
                else:
                    gsum = {name: torch.zeros_like(p) for name, p in detached.items()}
                grads = noisy_gradient(gsum, clip=cfg.clip, noise_multiplier=sigma,
                                       expected_batch_size=float(B), generator=rng)
            for name, p in params.items():
                p.grad = grads[name] + cfg.l2[kind] * p.detach()
            opt.step()
    return model


@torch.no_grad()
def evaluate(model: nn.Module, xtr, ytr, xte, yte) -> dict:
    ltr = F.cross_entropy(model(xtr), ytr, reduction="none")
    lte = F.cross_entropy(model(xte), yte, reduction="none")
    acc = lambda x, y: float((model(x).argmax(1) == y).float().mean())
    return {"train_acc": acc(xtr, ytr), "test_acc": acc(xte, yte), "membership_advantage": yeom_advantage(ltr, lte)}


def yeom_advantage(member_losses: torch.Tensor, nonmember_losses: torch.Tensor) -> float:
    """TPR - FPR of 'member iff loss < mean member loss' (Yeom et al. 2018)."""
    thr = member_losses.mean()
    return float((member_losses < thr).float().mean() - (nonmember_losses < thr).float().mean())


# ---- the experiment --------------------------------------------------------------------------


def load_data(cfg: Config, seed: int):
    from dpfl.data.images import load_fashion_mnist

    ds = load_fashion_mnist(cfg.data_root, seed=seed, n_train=cfg.n_train, n_test=cfg.n_test)
    flat = lambda t: t.reshape(t.shape[0], -1).float()
    return flat(ds.x_train), ds.y_train, flat(ds.x_test), ds.y_test, ds.num_classes


def run_comparison(cfg: Config, out_dir: str | Path | None = None, progress=None) -> dict:
    """Run the grid; write accounting_comparison.json and .png to `out_dir` if given."""
    cfg.check()
    t0 = time.time()
    sigmas = {m: {str(e): noise_multiplier(m, e, cfg.delta, cfg.epochs, cfg.n_train, cfg.batch_size)
                  for e in cfg.epsilons} for m in cfg.methods}
    achieved = {m: {e: achieved_epsilon(m, s, cfg.delta, cfg.epochs, cfg.n_train, cfg.batch_size)
                    for e, s in sig.items()} for m, sig in sigmas.items()}
    runs = []
    for rep in range(cfg.repeats):
        xtr, ytr, xte, yte, k = load_data(cfg, cfg.seed + rep)
        seeds = Seeds(cfg.seed + rep)
        for kind in cfg.models:
            t = time.time()
            base = evaluate(train(kind, xtr, ytr, k, cfg, None, "shuffle", Seeds(seeds.seed(kind, "base"))),
                            xtr, ytr, xte, yte)
            runs.append({"repeat": rep, "model": kind, "method": "none", "epsilon": None, "sigma": None, **base,
                         "seconds": time.time() - t})
            for m in cfg.methods:
                for e in cfg.epsilons:
                    t = time.time()
                    sig = sigmas[m][str(e)]
                    model = train(kind, xtr, ytr, k, cfg, sig, "shuffle" if m in ("nc", "ac", "zcdp") else "poisson",
                                  Seeds(seeds.seed(kind, m, e)))
                    res = evaluate(model, xtr, ytr, xte, yte)
                    res["accuracy_loss"] = 1.0 - res["test_acc"] / base["test_acc"]
                    runs.append({"repeat": rep, "model": kind, "method": m, "epsilon": e, "sigma": sig, **res,
                                 "seconds": time.time() - t})
                    if progress:
                        progress(runs[-1])
    out = {"config": {**asdict(cfg), "dataset": "fashion-mnist"}, "sigmas": sigmas, "achieved_epsilon": achieved,
           "runs": runs, "summary": summarise(runs), "seconds": time.time() - t0}
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "accounting_comparison.json").write_text(json.dumps(out, indent=1))
        plot(out, out_dir / "accounting_comparison.png")
    return out


def summarise(runs: list[dict]) -> dict:
    """Mean over repeats: summary[model][method][eps] = {accuracy_loss, membership_advantage, test_acc}."""
    out: dict = {}
    for r in runs:
        key = "baseline" if r["method"] == "none" else str(r["epsilon"])
        out.setdefault(r["model"], {}).setdefault(r["method"], {}).setdefault(key, []).append(r)
    for model in out.values():
        for by_eps in model.values():
            for key, rs in by_eps.items():
                by_eps[key] = {m: float(np.mean([r[m] for r in rs])) for m in
                               ("test_acc", "train_acc", "membership_advantage", "accuracy_loss") if m in rs[0]}
    return out


def plot(result: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    models = [m for m in MODELS if m in summary]
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 8), squeeze=False)
    titles = {"lr": "logistic regression", "nn": "MLP 2x256"}
    for j, model in enumerate(models):
        for method in METHODS:
            if method not in summary[model]:
                continue
            pts = sorted((float(e), v) for e, v in summary[model][method].items())
            eps = [p[0] for p in pts]
            axes[0, j].plot(eps, [p[1]["accuracy_loss"] for p in pts], marker="o", label=LABELS[method])
            axes[1, j].plot(eps, [p[1]["membership_advantage"] for p in pts], marker="o", label=LABELS[method])
        base = summary[model]["none"]["baseline"]
        axes[1, j].axhline(base["membership_advantage"], color="k", ls="--", lw=1, label="non-private")
        axes[0, j].set_title(f"{titles[model]} (non-private test acc {base['test_acc']:.3f})")
        for i, ylabel in enumerate(("accuracy loss", "membership advantage (Yeom)")):
            axes[i, j].set_xscale("log")
            axes[i, j].set_xlabel(f"ε (δ = {result['config']['delta']:g})")
            axes[i, j].set_ylabel(ylabel)
            axes[i, j].grid(alpha=0.3)
        axes[0, j].legend(fontsize=8)
    c = result["config"]
    fig.suptitle(f"Fashion-MNIST {c['n_train']}/{c['n_test']}, {c['epochs']} epochs, batch {c['batch_size']}, "
                 f"C={c['clip']}, {c['repeats']} repeat(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
