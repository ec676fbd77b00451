"""Choosing the clip bound S (thesis §5.2.6, §5.3.4, §5.4.5).

Thesis heuristics — they look at private data (or only public data) and are **not charged**
to the privacy budget, as in the thesis (§8.2):

* `client_median`: an extra initialisation round from w₀; every client (or a random subset)
  trains locally, compresses with the scheme's steps, and S = median of the L2 norms.
  This uses private data outside the accountant: the stated ε does not cover it.
* `public_topk`: FL-TOP-DP. One local round (T_gd SGD steps from w₀) on the server's public
  batch, restricted to the Top-K set; S = L2 norm of the K update values. Public data only.
* `public_random`: FL-BASIC-DP. The same with `repeats` random K-subsets; S = their median.

Private alternative, charged to the ledger:

* `private_median`: the client norms of the initialisation round, and S from the
  exponential mechanism over a log-spaced grid (utility −|(1−p)·#{‖Δ‖ ≤ c} − p·#{‖Δ‖ > c}|,
  sensitivity max(p, 1−p) under add/remove of a client): ε₀-DP, recorded as PureDPEvent(ε₀).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpfl.compression.subset import random_subset
from dpfl.errors import ConfigError
from dpfl.privacy import PureDPEvent
from dpfl.privacy.mechanisms import exponential_mechanism
from dpfl.schemes.base import RoundContext, SetupContext, Step
from dpfl.schemes.round import client_chain, train_mask
from dpfl.schemes.sampling import local_positions


def _round0(ctx: SetupContext, cohort: np.ndarray) -> RoundContext:
    k = len(cohort)
    return RoundContext(round=0, n_params=ctx.n_params, cohort=cohort, n_selected=k,
                        weights=torch.ones(k, device=ctx.device), seeds=ctx.seeds, device=ctx.device,
                        global_params=ctx.initial_params, n_clients=ctx.n_clients, cohort_size=ctx.cohort_size)


def _compressed_norms(u: torch.Tensor, steps: Sequence[Step], rctx: RoundContext) -> np.ndarray:
    return client_chain(steps, u, rctx).detach().to("cpu", torch.float64).norm(dim=1).numpy()


def _need_trainer(ctx: SetupContext, what: str):
    if ctx.trainer is None:
        raise ConfigError(f"{what} needs the engine's trainer (SetupContext.trainer is None)")
    return ctx.trainer


def client_norms(ctx: SetupContext, steps: Sequence[Step], clients: int | None = None,
                 chunk: int = 100) -> np.ndarray:
    """L2 norms of every (or `clients` random) client's compressed update in an
    initialisation round from w₀ (round 0: seeds distinct from training rounds)."""
    trainer = _need_trainer(ctx, "clip = 'auto'/'private' (client update norms)")
    fed = ctx.clients
    if fed is None:
        raise ConfigError("client update norms need the federation (SetupContext.clients is None)")
    n = len(fed.clients)
    if clients is None:
        ids = np.arange(n)
    elif isinstance(clients, bool) or not isinstance(clients, (int, np.integer)) or not 1 <= clients <= n:
        raise ConfigError(f"clip_clients must be an integer in [1, {n}] or omitted (all clients), got {clients!r}")
    else:
        ids = np.sort(ctx.seeds.numpy("dp-clip", "clients").choice(n, size=int(clients), replace=False))
    rctx = _round0(ctx, ids)
    mask = train_mask(steps, rctx)
    cfg = trainer.cfg
    pos = local_positions(fed.sizes[ids], cfg.steps, cfg.batch_size, ctx.seeds.numpy("dp-clip", "batches"))
    out = []
    for s in range(0, len(ids), max(1, chunk)):
        part = ids[s : s + chunk]
        idx = np.stack([fed.clients[c][p] for c, p in zip(part, pos[s : s + chunk])])
        torch.manual_seed(ctx.seeds.seed("dp-clip", "torch", s))
        u = trainer.train(ctx.initial_params, fed.x, fed.y, torch.from_numpy(idx).to(ctx.device), mask)
        out.append(_compressed_norms(u, steps, _round0(ctx, part)))
    return np.concatenate(out)


def client_median(ctx: SetupContext, steps: Sequence[Step], clients: int | None = None) -> tuple[float, str]:
    norms = client_norms(ctx, steps, clients)
    return float(np.median(norms)), (f"median of {norms.size} client update norms in an initialisation "
                                     "round, NOT charged to the privacy budget")


def _public_update(ctx: SetupContext, mask: torch.Tensor, seed_path: tuple) -> torch.Tensor:
    trainer = _need_trainer(ctx, "public-batch clip selection")
    if ctx.public_data is None:
        raise ConfigError("public-batch clip selection needs public data (set data.public_size or use a "
                          "dataset with a public part)")
    x, y = (t.to(ctx.device) for t in ctx.public_data)
    cfg = trainer.cfg
    pos = local_positions(np.array([len(y)]), cfg.steps, cfg.batch_size, ctx.seeds.numpy("dp-clip", *seed_path))
    torch.manual_seed(ctx.seeds.seed("dp-clip", "torch", *seed_path))
    return trainer.train(ctx.initial_params, x, y, torch.from_numpy(pos[0][None]).to(ctx.device), mask)[0]


def public_topk(ctx: SetupContext, indices: torch.Tensor) -> tuple[float, str]:
    """FL-TOP-DP: ‖Top-K part of one public-batch local round from w₀‖₂ (Top-K training)."""
    mask = torch.zeros(ctx.n_params, dtype=torch.bool, device=ctx.device)
    mask[indices.to(ctx.device)] = True
    u = _public_update(ctx, mask, ("topk",))
    return float(u[indices.to(u.device)].to(torch.float64).norm()), "public-batch Top-K update norm (public data)"


def public_random(ctx: SetupContext, k: int, repeats: int = 100) -> tuple[float, str]:
    """FL-BASIC-DP: median over `repeats` random K-subsets of the public-batch update norm
    (subset j = `random_subset(n, k, ctx.seeds.numpy("dp-clip", "subset", j))`)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"clip_repeats must be an integer ≥ 1, got {repeats!r}")
    norms = []
    for j in range(repeats):
        idx = random_subset(ctx.n_params, k, ctx.seeds.numpy("dp-clip", "subset", j))
        mask = torch.zeros(ctx.n_params, dtype=torch.bool, device=ctx.device)
        mask[idx.to(ctx.device)] = True
        u = _public_update(ctx, mask, ("subset-train", j))
        norms.append(float(u[idx.to(u.device)].to(torch.float64).norm()))
    return float(np.median(norms)), f"median over {repeats} random K-subsets of the public-batch update norm (public data)"


def dp_quantile(values: np.ndarray, epsilon: float, rng, p: float = 0.5, lo: float = 1e-6, hi: float = 1e3,
                grid: int = 2000) -> float:
    """ε-DP p-quantile of `values` (one per client) by the exponential mechanism on a log grid."""
    if not 0 < p < 1:
        raise ConfigError(f"quantile p must be in (0, 1), got {p}")
    if not 0 < lo < hi or grid < 2:
        raise ConfigError(f"need 0 < lo < hi and grid ≥ 2, got lo={lo}, hi={hi}, grid={grid}")
    cand = np.geomspace(lo, hi, grid)
    util = quantile_utility(values, cand, p)
    return float(cand[exponential_mechanism(util, epsilon, max(p, 1 - p), rng)])


def quantile_utility(values: np.ndarray, cand: np.ndarray, p: float) -> np.ndarray:
    """u(c) = −|(1−p)·#{v ≤ c} − p·#{v > c}|: adding or removing one value moves it by ≤ max(p, 1−p)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    below = np.searchsorted(v, cand, side="right")
    return -np.abs((1 - p) * below - p * (v.size - below))


def private_median_event(epsilon: float, neighbouring: str) -> PureDPEvent:
    """The median's cost: ε₀ for add/remove neighbours; replacing one client moves the utility by up
    to 1 = 2 × its add/remove sensitivity, so 2ε₀ for replace-one."""
    return PureDPEvent(2 * epsilon if neighbouring == "replace_one" else epsilon)


def private_median(ctx: SetupContext, steps: Sequence[Step], epsilon: float,
                   clients: int | None = None) -> tuple[float, str]:
    """DP median of the initialisation-round norms; PureDPEvent(ε₀) goes to the ledger."""
    if ctx.ledger is None:
        raise ConfigError("clip = 'private' charges the ledger, but SetupContext.ledger is None")
    ctx.ledger.add(private_median_event(epsilon, ctx.ledger.neighbouring))  # BudgetExceededError first
    norms = client_norms(ctx, steps, clients)
    s = dp_quantile(norms, epsilon, ctx.seeds.crypto("dp-clip", "quantile"))
    return s, f"ε₀ = {epsilon} DP median of {norms.size} client update norms, charged to the ledger"
