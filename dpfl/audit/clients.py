"""Client-level audit: canary clients through the real round (Andrew et al. 2024's canaries, scored for
Steinke et al. 2023's one-run bound).

The audited run has the config's N clients plus m canary clients (ids N … N+m−1; the data are
partitioned over all N + m, a canary's own data goes unused). Canary j is a member of the federation
with probability 1/2 (`CanarySet.included`); an excluded canary is never selected, exactly as if it were
not in the population. Client selection is otherwise the run's own (Poisson, or every client each round),
so an included canary takes part in a round like any client. When it does, its raw update is the fixed
direction u_j scaled to `scale`·S (S the scheme's clip bound; 1 for schemes without one), and from there
it goes through the scheme's client chain (compression, clipping, noise share), the transport (secure
sum) and the server chain like every other row: nothing is shortcut.

Scores (they never use who took part in which round: that would undo amplification by sampling):

    white box   Σ_t ⟨u_j, Δ_t⟩ / ‖Δ_t‖²   over the released model updates Δ_t, i.e. each round's cosine
                weighted by 1/‖Δ_t‖ (inverse-variance weighting: a round with less noise counts more)
    black box   cos(u_j, w_T − w_0)          the final model only
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.audit.canaries import CanarySet
from dpfl.config import RunConfig
from dpfl.engine.simulator import Updates, simulate
from dpfl.errors import ConfigError
from dpfl.rng import Seeds
from dpfl.run.state import Run
from dpfl.schemes.base import RoundContext
from dpfl.schemes.dp import ClipStep


def check_client_config(cfg: RunConfig) -> None:
    """ConfigError (one line) for a run a client-level audit cannot measure as accounted."""
    if cfg.attack is not None and cfg.attack.name != "none":
        raise ConfigError("an audit runs without an attack: remove the [attack] section")
    fed = cfg.federation
    if fed.sampling == "fixed" and cfg.cohort_size() < cfg.data.n_clients:
        raise ConfigError("a client-level audit needs federation.sampling = 'poisson' (or every client in every "
                          "round): a fixed-size cohort is accounted with replace-one neighbours, and a canary "
                          "is added or removed")


def audit_config(cfg: RunConfig, canaries: int) -> RunConfig:
    """The audited run's config: N + m clients, each selected with the config's rate q (the accounted ε
    is the audited run's own, for the rate it ends up with: round(q·(N + m)) / (N + m))."""
    check_client_config(cfg)
    out = cfg.model_copy(deep=True)
    out.data.n_clients = cfg.data.n_clients + canaries
    out.federation.clients_per_round = None
    out.federation.fraction = cfg.sampling_rate()
    return out


class CanaryRun(Run):
    """A `Run` whose last m clients are canaries (see the module docstring)."""

    def __init__(self, cfg: RunConfig, canaries: int, out_dir: str | Path | None = None,
                 log: Callable[[str], None] = print, overwrite: bool = False, scale: float = 10.0):
        if not (scale > 0 and np.isfinite(scale)):
            raise ConfigError(f"canary scale must be a finite number > 0, got {scale!r}")
        self.n_real = cfg.data.n_clients
        self.scale = float(scale)
        seeds = Seeds(cfg.seed)
        self.coins = seeds.numpy("audit", "include").random(int(canaries)) < 0.5  # = CanarySet.included
        self._present = np.concatenate([np.ones(self.n_real, dtype=bool), self.coins])
        super().__init__(audit_config(cfg, int(canaries)), out_dir, log, overwrite)
        self.canaries = CanarySet(int(canaries), self.flat.n, self.seeds)
        assert (self.canaries.included == self.coins).all()

    def select(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        answering, dropped = super().select(r)
        return answering[self._present[answering]], dropped[self._present[dropped]]

    def canary_norm(self) -> float:
        clips = [s.bound for s in self.scheme.steps if isinstance(s, ClipStep) and s.bound is not None]
        return self.scale * (clips[0] if clips else 1.0)

    def with_canaries(self, train: Updates) -> Updates:
        """The simulator's local training `train`, with the canaries' rows replaced by their updates."""

        def updates(ctx: RoundContext, batches: torch.Tensor | None, seed: bool) -> torch.Tensor:
            canary = ctx.cohort >= self.n_real
            if not canary.any():
                return train(ctx, batches, seed)
            real = ~canary
            u = torch.empty(len(ctx.cohort), self.flat.n, device=self.device)
            if real.any():
                keep = torch.from_numpy(real).to(ctx.weights.device)
                sub = replace(ctx, cohort=ctx.cohort[real], weights=ctx.weights[keep],
                              malicious=None if ctx.malicious is None else ctx.malicious[real],
                              omit_noise=None if ctx.omit_noise is None else ctx.omit_noise[real])
                part = None if batches is None else batches[torch.from_numpy(real).to(batches.device)]
                u[torch.from_numpy(real).to(u.device)] = train(sub, part, seed).to(u)
            rows = self.canaries.rows(ctx.cohort[canary] - self.n_real) * self.canary_norm()
            u[torch.from_numpy(canary).to(u.device)] = rows.to(u)
            return u

        return updates


def run_client_audit(cfg: RunConfig, canaries: int, observe: str = "white", out_dir: str | Path | None = None,
                     log: Callable[[str], None] = print, overwrite: bool = False, scale: float = 10.0,
                     on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train once with canary clients; return their scores and the run's accounting (see `audit.run`)."""
    if observe not in ("white", "black"):
        raise ConfigError(f"observe must be 'white' or 'black', got {observe!r}")
    run = CanaryRun(cfg, canaries, out_dir, log, overwrite, scale)
    if not run.scheme.private:
        raise ConfigError(f"scheme {run.scheme.name!r} adds no client-level DP noise: nothing to audit at the "
                          "client level")
    run.setup()
    w0 = run.w.detach().clone()
    prev = [w0]
    white = np.zeros(canaries) if observe == "white" else None
    released = [0]

    def score(m: dict[str, Any]) -> None:
        w = run.w.detach().clone()
        delta = (w - prev[0]).to(torch.float64)
        prev[0] = w
        sq = float(delta.dot(delta))
        if white is not None and "aborted" not in m and sq > 0:
            white[:] += run.canaries.dots(delta) / sq
            released[0] += 1
        if on_round is not None:
            on_round(m)

    summary = simulate(run, score, wrap=run.with_canaries)
    total = (run.w.detach() - w0).to(torch.float64)
    norm = float(total.norm())
    black = run.canaries.dots(total) / norm if norm > 0 else np.zeros(canaries)
    return {"level": "client", "summary": summary, "included": run.canaries.included,
            "scores": {"white": white, "black": black}, "released_rounds": released[0],
            "canary_norm": run.canary_norm(), "epsilon": summary.get("epsilon_final"),
            "delta": run.cfg.privacy.delta}
