"""Malicious client behaviours (thesis ch. 6): who is malicious each round, and what they send.

Every behaviour takes the same common options:

- ``fraction``, ``mode``: the share of each round's answering cohort that is malicious, either
  exactly ``round(fraction·k)`` rows (``fixed``) or each row independently (``bernoulli``);
- ``persistent``: instead of drawing the malicious rows anew every round (thesis §6.1, "a fraction
  of the participating clients at each round"), fix a set of malicious *clients* once
  (``round(fraction·N)`` of them, or each with probability ``fraction``); a round's malicious rows
  are then the cohort members in that set;
- ``boost`` (η_Adv): explicit boosting, the malicious rows' raw updates are multiplied by it;
- ``omit_noise``: the attackers add no noise share: `select` sets ``ctx.omit_noise`` (bool [k], the
  malicious rows), which the DP noise steps (`dpfl.schemes.dp`) skip;
- ``sign_boost``: after the scheme's client chain, a malicious row is replaced by
  ``sign_boost · sign(row)`` (thesis §6.3, FL-SIGN-DP: signs boosted by η_Adv = 5000, no noise).

Colluders (gradient ascent, backdoors) also take ``pool_epochs``: the union of their data is trained
for as many epochs as a client's T_gd steps make over its own data, not for T_gd steps (the thesis
gives T_gd in steps, a whole number of epochs of |D_k|, and does not say which one the union got).

Behaviours: ``boost`` (honest training, boosted), ``random-update`` (G(0, σ_Adv²·I), independent per
attacker), ``sign-inversion`` (each attacker sends −Δw), ``gradient-ascent`` (colluders ascend on
the union of their data). The backdoors are in `dpfl.attacks.backdoor`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dpfl.attacks.base import Attack
from dpfl.compression.bits import random_sign
from dpfl.errors import ConfigError
from dpfl.schemes.base import RoundContext
from dpfl.schemes.round import batch_plan, train_mask
from dpfl.schemes.sampling import local_positions


def _check_positive(name: str, attack: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v <= 0:
        raise ConfigError(f"attack {attack!r}: {name} must be a positive number, got {v!r}")
    return float(v)


class Malicious(Attack):
    """Selection of the malicious rows, explicit boosting and boosted signs (the common options)."""

    name = "malicious"

    def __init__(self, fraction: float, mode: str = "fixed", *, boost: float = 1.0, persistent: bool = False,
                 omit_noise: bool = False, sign_boost: float | None = None):
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ConfigError(f"attack {self.name!r}: fraction must be in [0, 1], got {fraction!r}")
        if mode not in ("fixed", "bernoulli"):
            raise ConfigError(f"attack {self.name!r}: mode must be 'fixed' or 'bernoulli', got {mode!r}")
        for key, v in (("persistent", persistent), ("omit_noise", omit_noise)):
            if not isinstance(v, bool):
                raise ConfigError(f"attack {self.name!r}: {key} must be true or false, got {v!r}")
        self.fraction, self.mode, self.persistent = float(fraction), mode, persistent
        self.boost = _check_positive("boost", self.name, boost)
        self.omit_noise = omit_noise
        self.sign_boost = None if sign_boost is None else _check_positive("sign_boost", self.name, sign_boost)
        self._clients: np.ndarray | None = None  # persistent malicious clients, bool [N]

    # ---- who is malicious ----------------------------------------------------------
    def _draw(self, k: int, rng: np.random.Generator) -> np.ndarray:
        bad = np.zeros(k, dtype=bool)
        if self.mode == "fixed":
            bad[rng.choice(k, size=int(np.floor(self.fraction * k + 0.5)), replace=False)] = True
        else:
            bad[:] = rng.random(k) < self.fraction
        return bad

    def malicious_clients(self, n_clients: int, seeds: Any) -> np.ndarray:
        """bool [N]: the persistent malicious clients (drawn once from the run's seed)."""
        if self._clients is None or len(self._clients) != n_clients:
            self._clients = self._draw(n_clients, seeds.numpy("attack", "clients"))
        return self._clients

    def select(self, ctx: RoundContext) -> np.ndarray:
        if self.persistent:
            bad = self.malicious_clients(ctx.n_clients, ctx.seeds)[ctx.cohort].copy()
        else:
            bad = self._draw(len(ctx.cohort), ctx.numpy_rng("attack", "select"))
        if self.omit_noise:
            ctx.omit_noise = bad.copy()  # bool [k]: DP noise steps add no share for these rows
        return bad

    # ---- what they send ------------------------------------------------------------
    def replace(self, u: torch.Tensor, bad: torch.Tensor, ctx: RoundContext) -> None:
        """Overwrite the malicious rows of the raw updates in place (behaviour-specific)."""

    def tamper(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if ctx.malicious is None or not ctx.malicious.any():
            return u
        bad = torch.from_numpy(ctx.malicious).to(u.device)
        self.replace(u, bad, ctx)
        if self.boost != 1.0:
            u[bad] *= self.boost
        return u

    def after_chain(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if self.sign_boost is None or ctx.malicious is None or not ctx.malicious.any():
            return u
        if not u.is_floating_point() and self.sign_boost != round(self.sign_boost):
            raise ConfigError(f"attack {self.name!r}: the scheme sends integers, so sign_boost must be "
                              f"an integer, got {self.sign_boost}")
        bad = torch.from_numpy(ctx.malicious).to(u.device)
        s = random_sign(u[bad].detach().cpu().numpy(), ctx.numpy_rng("attack", "sign-zeros"))
        eta = self.sign_boost if u.is_floating_point() else int(self.sign_boost)
        if u.is_floating_point():
            out = u.clone()
        elif eta <= torch.iinfo(u.dtype).max:
            out = u  # integer rows are the chain's own output: the boosted rows are written in place
        else:
            out = u.to(torch.int64)  # room for the boosted values (the wire format decides what survives)
        out[bad] = torch.from_numpy(s).to(out.device, out.dtype) * eta
        return out

    def describe(self) -> str:
        extra = [f"boost={self.boost:g}"] if self.boost != 1 else []
        extra += ["persistent"] if self.persistent else []
        extra += ["omit_noise"] if self.omit_noise else []
        extra += [f"sign_boost={self.sign_boost:g}"] if self.sign_boost else []
        return f"{self.name}({self.mode} {self.fraction:g}{''.join(', ' + e for e in extra)})"


class Boosting(Malicious):
    """Explicit boosting alone: malicious clients train honestly and send η_Adv·Δw."""

    name = "boost"

    def __init__(self, fraction: float, mode: str = "fixed", *, boost: float, **kw):
        super().__init__(fraction, mode, boost=boost, **kw)


class RandomUpdate(Malicious):
    """Each malicious client sends Δŵ ~ G(0, σ_Adv²·I), drawn independently (no collusion)."""

    name = "random-update"

    def __init__(self, fraction: float, mode: str = "fixed", *, sigma: float = 200.0, **kw):
        super().__init__(fraction, mode, **kw)
        self.sigma = _check_positive("sigma", self.name, sigma)

    def replace(self, u: torch.Tensor, bad: torch.Tensor, ctx: RoundContext) -> None:
        m = int(bad.sum())
        z = torch.randn(m, u.shape[1], generator=ctx.torch_rng("attack", "random-update"), dtype=torch.float32)
        u[bad] = (z * self.sigma).to(u)


class SignInversion(Malicious):
    """Each malicious client computes its update honestly and sends its negation (−Δw)."""

    name = "sign-inversion"

    def replace(self, u: torch.Tensor, bad: torch.Tensor, ctx: RoundContext) -> None:
        u[bad] = -u[bad]


class Colluding(Malicious):
    """Malicious clients pool their data and all send one update computed on the union
    (descent, or ascent when ``direction = -1``) with labels from `labels`."""

    direction = 1.0

    def __init__(self, fraction: float, mode: str = "fixed", *, pool_epochs: bool = False, **kw):
        super().__init__(fraction, mode, **kw)
        if not isinstance(pool_epochs, bool):
            raise ConfigError(f"attack {self.name!r}: pool_epochs must be true or false, got {pool_epochs!r}")
        # False: the pool trains T_gd steps, like one client; True: as many passes over the union as
        # a client makes over its own data (T_gd·|B|/|D_k| epochs: Keras `fit(epochs=…)` on the union)
        self.pool_epochs = pool_epochs

    def _pool_plan(self, run: Any, pool: int, colluders: int) -> tuple[int, int]:
        """(steps, batch) for the union: T_gd steps, or with pool_epochs T_gd per colluder (the same
        epochs over the union, |pool| / mean |D_k| = colluders, as each client's T_gd over its own)."""
        steps, batch = batch_plan(run.scheme, run.local, np.array([pool]))
        if not self.pool_epochs:
            return steps, batch
        if run.scheme.full_batch or run.scheme.one_pass:
            raise ConfigError(f"attack {self.name!r}: pool_epochs applies to schemes that train T_gd steps, "
                              f"not to {run.scheme.name} (it already sizes local training by the data)")
        return steps * colluders, batch

    def attacker_indices(self, run: Any, client: int) -> np.ndarray:
        """Training-set rows an attacking client brings to the pool."""
        return run.fed.clients[client]

    def labels(self, run: Any) -> torch.Tensor:
        return run.fed.y

    def train(self, run: Any, ctx: RoundContext, honest_updates: torch.Tensor) -> torch.Tensor:
        bad = ctx.malicious
        if bad is None or not bad.any():
            return honest_updates
        pool = np.concatenate([self.attacker_indices(run, int(c)) for c in ctx.cohort[bad]])
        steps, batch = self._pool_plan(run, len(pool), int(bad.sum()))
        pos = local_positions(np.array([len(pool)]), steps, batch, ctx.numpy_rng("attack", "batches"))[0]
        batches = torch.from_numpy(pool[pos][None]).to(run.device)
        torch.manual_seed(ctx.seeds.seed("round", ctx.round, "attack", "torch"))  # dropout layers
        sign = torch.full((1,), self.direction, device=run.device)
        mask, y = train_mask(run.scheme.steps, ctx), self.labels(run)
        row = run.trainer.train(run.w, run.fed.x, y, batches, mask, sign)
        if not bool(torch.isfinite(row).all()):  # the ascent overflowed: send the last finite iterate
            row = self._last_finite(run, y, batches, mask, sign)
        u = honest_updates
        u[torch.from_numpy(bad).to(u.device)] = row.to(u)
        return u

    @staticmethod
    def _last_finite(run: Any, y: torch.Tensor, batches: torch.Tensor, mask: Any, sign: torch.Tensor) -> torch.Tensor:
        """Redo the local steps one at a time from the global model and keep the update of the last
        step whose model is still finite (an attacker sends what hurts most and still gets accepted;
        NaN would be rejected, and a simulator that dropped it would silently disarm the attack).
        One step per call restarts the optimizer state: exact for plain SGD."""
        total = torch.zeros_like(run.w)
        for t in range(batches.shape[1]):
            step = run.trainer.train(run.w + total, run.fed.x, y, batches[:, t : t + 1], mask, sign)[0]
            if not bool(torch.isfinite(step).all()) or not bool(torch.isfinite(total + step).all()):
                break
            total += step
        return total[None]


class GradientAscent(Colluding):
    """Colluding gradient ascent on the union of the malicious clients' data (boost: η_Adv)."""

    name = "gradient-ascent"
    direction = -1.0
