"""Client-level DP steps (thesis ch. 5): clipping, noise shares, noise placement, and the
privacy event each round adds to the ledger.

A DP scheme is a chain  [compression step] → ClipStep(S) → GaussianNoiseStep(σ)  (or, for FL-SIGN-DP,
SignStep → DiscreteGaussianShareStep(σ)), a transport and an aggregator (see `dp_wrapper.make_private`).
With adaptive clipping (Andrew et al. 2021) `AdaptiveClipStep` replaces ClipStep(S): each row carries one
more value, the client's b − ½ = 1[‖Δ‖ ≤ C_t] − ½, noised with σ_b like the row and summed with it; σ is
the joint multiplier the ledger records and the update's noise is σ_Δ (`adaptive_update_sigma`).

Noise placement (`noise=`):

* ``distributed`` (default, thesis): each of the k answering clients adds a share
  G(0, (Sσ)²/(k − l)) (FL-SIGN-DP: z ~ DG(sign, √n·σ/√(k − l))) and the rows reach the server
  only as a secure sum (`SecureSum`). l = `tolerate` is the number of clients that may fail
  after masking: if f ≤ l fail, the k − f surviving shares carry noise variance
  (k − f)/(k − l)·(Sσ)² ≥ (Sσ)² (more noise than needed, the guarantee holds); if f > l the
  transport aborts the round (`RoundAborted`) and nothing is released. Event per round:
  SampledGaussianEvent(σ, q) (DiscreteGaussianEvent for FL-SIGN-DP, with the sampler's TV), or,
  for a fixed-size cohort accounted as drawn, SampledWithoutReplacementGaussianEvent(σ, N, |K|)
  (replace-one neighbours).
* ``central``: clients send clipped rows in plain to a *trusted* server, which adds
  G(0, (Sσ)²) to the sum (DG(0, √n·σ) for FL-SIGN-DP). Same event as distributed.
* ``local``: every client adds the full G(0, (Sσ)²) and sends in plain; no secure
  aggregation. The server sees who took part and each noisy row, so there is no
  amplification by sampling, and local DP protects a client's row against *any* other
  input of that client: ‖x − x'‖ ≤ 2S, i.e. noise multiplier σ/2 under the ledger's
  add/remove relation. A client that took part c times has spent c × GaussianEvent(σ/2);
  the ledger tracks the worst client: it records one event in each round in which the
  largest participation count grows.

Known limits (documented, shared with the thesis): under add/remove neighbouring the number
of noise shares depends on whether the target client takes part, so the two outputs differ
slightly in variance as well as in mean; the accountant treats the round as the Gaussian
mechanism with noise multiplier σ. Gaussian shares are floating-point draws (the ziggurat on
CryptoRNG words, `dpfl.rng.gauss`), not an exact lattice sampler; FL-SIGN-DP uses the integer sampler.
Metrics such as the clipped fraction are simulation diagnostics, not DP releases.

Correlated noise (``correlated = "tree" | "bandmf"``, `CorrelatedNoiseStep`): DP-FTRL's tree aggregation or
BandMF, noise correlated across rounds (`dpfl.privacy.factorization`), central or (all clients in every round)
distributed, accounted on the federation's participation schema; see docs/dp-schemes.md.

Attacks: rows flagged in ``ctx.omit_noise`` (bool [k], set by an attack's ``select``) add no
noise; ``dp_noise_shares`` in the metrics counts the rows that did.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dpfl.errors import ConfigError, ProtocolError
from dpfl.privacy import (
    DiscreteGaussianEvent,
    GaussianEvent,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    sampler_tv_bound,
)
from dpfl.privacy.mechanisms import discrete_gaussian, gaussian_noise
from dpfl.privacy.samplers import discrete_gaussian_rows
from dpfl.rng import gaussian_rows
from dpfl.schemes.base import Aggregator, Received, RoundContext, SetupContext, Step
from dpfl.secagg import RoundAborted
from dpfl.threads import workers

PLACEMENTS = ("distributed", "local", "central")


def check_placement(noise: str) -> str:
    if noise not in PLACEMENTS:
        raise ConfigError(f"noise placement must be one of {PLACEMENTS}, got {noise!r}")
    return noise


def check_tolerate(tolerate: int) -> int:
    if isinstance(tolerate, bool) or not isinstance(tolerate, (int, np.integer)) or tolerate < 0:
        raise ConfigError(f"tolerate (l, client failures the noise covers) must be an integer ≥ 0, got {tolerate!r}")
    return int(tolerate)


def _positive(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def shares(k: int, tolerate: int) -> int:
    """Noise shares the calibration counts on: k − l (≥ 1, else the round cannot run)."""
    if k - tolerate < 1:
        raise RoundAborted(f"{k} answering clients cannot tolerate l = {tolerate} failures: "
                           "the round releases nothing")
    return k - tolerate


def dp_denominator(ctx: RoundContext) -> int:
    """The DP mean divides by the public expected cohort size |K| (not the random count)."""
    return max(1, int(ctx.cohort_size or len(ctx.cohort)))


def _omitted(ctx: RoundContext, k: int) -> np.ndarray:
    m = getattr(ctx, "omit_noise", None)
    return np.zeros(k, dtype=bool) if m is None else np.asarray(m, dtype=bool).reshape(k)


def clip_rows(u: torch.Tensor, bound: float) -> tuple[torch.Tensor, np.ndarray]:
    """Per-row L2 clip û = u / max(1, ‖u‖/S), computed in float64 and guaranteed ‖û‖ ≤ S after
    the cast back. A row with NaN or ±inf (diverged local training) becomes 0, so every input
    lands in the S-ball. Returns (û, bool [k] rows that were scaled or zeroed)."""
    out, over, bad = _clip(u, bound)
    return out, over | bad


def _clip(u: torch.Tensor, bound: float) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """`clip_rows`, also returning the scaled rows and the zeroed (non-finite) rows apart."""
    x = u.detach()
    norms = _row_norms(x)
    if x.dtype.itemsize <= 4:  # a float64 sum of squares of ≤ 32-bit floats cannot overflow: a norm is
        bad = ~torch.isfinite(norms)  # NaN or infinite exactly when its row holds a NaN or an infinity
    else:
        bad = ~finite_rows(x)
    if bool(bad.any()):
        x = x.clone()
        x[bad] = 0
        norms = torch.where(bad, torch.zeros_like(norms), norms)
    over = norms > bound
    factor = torch.where(over, bound / norms.clamp_min(1e-300), torch.ones_like(norms))
    out = x * factor.to(x.dtype)[:, None]
    check = torch.nonzero(over).flatten()  # only scaled rows can end above S (the rest are x, ≤ S)
    for _ in range(8):  # float rounding can leave a norm a few ulps above S
        check = check[_row_norms(out[check]) > bound]
        if not len(check):
            return out, over.cpu().numpy(), bad.cpu().numpy()
        out[check] *= 1 - 1e-6
    raise RuntimeError("clipping did not converge")  # unreachable for finite inputs


def finite_rows(x: torch.Tensor) -> torch.Tensor:
    """bool [k]: rows without NaN or ±inf. One pass, no [k, n] temporary: a row's sum is finite unless
    the row holds NaN or ±inf or the sum overflowed, so only rows whose sum is not finite are checked
    value by value."""
    if x.is_complex():
        return torch.isfinite(x).all(1)
    if x.shape[0] == 0 or x.shape[1] == 0 or not x.is_floating_point():
        return torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    ok = torch.isfinite(x.sum(1))
    for i in torch.nonzero(~ok).flatten().tolist():
        ok[i] = bool(torch.isfinite(x[i]).all())
    return ok


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of each row, accumulated in float64 one row at a time (bounded memory)."""
    return torch.stack([row.to(torch.float64).norm() for row in x]) if len(x) else torch.zeros(0, dtype=torch.float64)


class ClipStep(Step):
    """Client: û = u / max(1, ‖u‖₂/S) per row. S is a number, or chosen once in `setup` by
    `selector(ctx) -> (S, how)` (see `dpfl.schemes.sensitivity`)."""

    name = "clip"

    def __init__(self, bound: float | None = None,
                 selector: Callable[[SetupContext], tuple[float, str]] | None = None):
        if (bound is None) == (selector is None):
            raise ConfigError("ClipStep needs either a bound S or a selector")
        self.bound = None if bound is None else _positive("clip bound S", bound)
        self.selector = selector
        self.how = "given"

    def setup(self, ctx: SetupContext) -> None:
        if self.selector is not None:
            bound, self.how = self.selector(ctx)
            self.bound = _positive("selected clip bound S", bound)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return self._clipped(u, ctx)[0]

    def _clipped(self, u: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, np.ndarray]:
        """(clipped rows, bool [k] rows that were scaled or zeroed), with the clip metrics."""
        if not u.is_floating_point():
            raise ConfigError(f"clipping needs real-valued updates, got {u.dtype}")
        out, over, bad = _clip(u, self.bound)
        over |= bad
        ctx.metrics["dp_clip_fraction"] = float(over.mean()) if over.size else 0.0
        nonfinite = int(bad.sum())
        if nonfinite:
            ctx.metrics["dp_nonfinite_rows"] = nonfinite
        ctx.metrics["dp_clip_bound"] = self.bound
        return out, over

    def state_dict(self) -> dict[str, Any]:
        return {"bound": self.bound, "how": self.how}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bound, self.how = state["bound"], state["how"]

    def describe(self) -> str:
        return f"clip(S={self.bound if self.bound is None else round(self.bound, 6)}, {self.how})"


def adaptive_update_sigma(sigma: float, count_sigma: float) -> float:
    """Andrew et al. (2021) σ split: the update's noise multiplier z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) for which
    the joint release — the clipped updates' sum (sensitivity S) with noise z_Δ·S and the count of
    b − ½ (sensitivity ½) with noise σ_b — is the Gaussian mechanism with multiplier z. Needs 2σ_b > z."""
    sigma, count_sigma = _positive("noise multiplier σ", sigma), _positive("count noise σ_b", count_sigma)
    if 2 * count_sigma <= sigma:
        raise ConfigError(f"clip = 'adaptive': the count's noise σ_b = clip_count_sigma = {count_sigma:.6g} must "
                          f"exceed σ/2 = {sigma / 2:.6g} (the update's σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) is undefined "
                          "otherwise); raise clip_count_sigma (default |K|/20), the cohort, or lower σ (raise ε)")
    return (sigma ** -2 - (2 * count_sigma) ** -2) ** -0.5


def joint_sigma(update_sigma: float, count_sigma: float) -> float:
    """The joint release's noise multiplier (z_Δ⁻² + (2σ_b)⁻²)^(−1/2): `adaptive_update_sigma`'s inverse."""
    return (update_sigma ** -2 + (2 * count_sigma) ** -2) ** -0.5


class AdaptiveClipStep(ClipStep):
    """Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with
    Adaptive Clipping", NeurIPS 2021, Alg. 1 with the geometric update).

    Client: û = u / max(1, ‖u‖/C_t) as `ClipStep`, and one more value per row, b − ½ with
    b = 1[‖u‖ ≤ C_t] of the unclipped update (a non-finite update counts as above): rows [k, d] →
    [k, d + 1]. The noise step gives that value its own noise (σ_b in all, split like the update's), the
    transport carries it with the row (inside the secure sum: only the sum is revealed).
    Server (reverse chain, after the DP mean): the last value is b̃/|K| with b̃ = Σ(b − ½) + N(0, σ_b²);
    b̄ = clamp(b̃/|K| + ½, 0, 1) is the noisy unclipped fraction and C_{t+1} = C_t·exp(−η_C(b̄ − γ)).
    The ±½ centring makes the count's sensitivity ½, which is where the (2σ_b)⁻² of the σ split comes from.
    C_t is the step's state (checkpointed); deployed clients get it in the round plan (`round_values`).
    """

    needs_aggregator = "dp_mean"  # the count's last value is read as (Σ(b − ½) + noise)/|K|

    def __init__(self, init: float = 0.1, quantile: float = 0.5, lr: float = 0.2, count_sigma: float = 1.0):
        super().__init__(init)
        self.init = self.bound
        if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
            raise ConfigError(f"clip_quantile (target quantile γ) must be a fraction in (0, 1], got {quantile!r}")
        self.quantile = float(quantile)
        self.lr = _positive("clip_lr (learning rate η_C)", lr)
        self.count_sigma = _positive("clip_count_sigma (count noise σ_b)", count_sigma)
        self.how = "adaptive"

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        out, over = self._clipped(u, ctx)
        count = torch.from_numpy(np.where(over, -0.5, 0.5)).to(out.device, out.dtype)  # b − ½, b = 1[‖u‖ ≤ C_t]
        return torch.cat([out, count[:, None]], 1)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        frac = min(1.0, max(0.0, float(agg[-1]) + 0.5))  # b̄: only the noisy count is read
        ctx.metrics["dp_clip_bound"] = self.bound  # C_t (over Flower, clients clip remotely)
        ctx.metrics["dp_clip_noisy_unclipped"] = frac
        self.bound = self.bound * math.exp(-self.lr * (frac - self.quantile))
        ctx.metrics["dp_clip_next"] = self.bound
        return agg[:-1]

    def round_values(self) -> dict[str, float]:
        return {"bound": self.bound}

    def load_round_values(self, values: dict[str, float]) -> None:
        v = values.get("bound")
        if isinstance(v, bool) or not isinstance(v, float) or not math.isfinite(v) or v <= 0:
            raise ProtocolError(f"the adaptive clip bound in the round plan must be a finite number > 0, got {v!r}")
        self.bound = v

    def describe(self) -> str:
        return (f"clip(adaptive, C0={self.init:.6g}, γ={self.quantile:.6g}, η={self.lr:.6g}, "
                f"σ_b={self.count_sigma:.6g})")


class _Participation:
    """Per-client participation counts for `local` noise (worst client's composition)."""

    def __init__(self):
        self.counts: np.ndarray | None = None
        self.max = 0

    def setup(self, n_clients: int) -> None:
        if self.counts is None:
            self.counts = np.zeros(max(1, n_clients), dtype=np.int64)

    def grows(self, cohort: np.ndarray) -> bool:
        return len(cohort) > 0 and int(self.counts[cohort].max()) + 1 > self.max

    def record(self, cohort: np.ndarray) -> None:
        if len(cohort):
            self.counts[cohort] += 1
            self.max = max(self.max, int(self.counts[cohort].max()))

    def state(self) -> dict[str, Any]:
        return {"counts": None if self.counts is None else self.counts.copy(), "max": self.max}

    def load(self, st: dict[str, Any]) -> None:
        self.counts = None if st["counts"] is None else np.array(st["counts"], dtype=np.int64)
        self.max = int(st["max"])


class _NoiseStep(Step):
    """What both noise steps share: σ, q, l, placement, local-noise participation, state."""

    label = ""  # the name in `describe`
    private = True  # adds privacy events: the run keeps a ledger
    without_replacement: tuple[int, int] | None = None  # (N, |K|) when the event samples without replacement

    def __init__(self, sigma: float, q: float, tolerate: int = 0, noise: str = "distributed"):
        self.sigma = _positive("noise multiplier σ", sigma)
        self.q = float(q)
        self.tolerate, self.noise = check_tolerate(tolerate), check_placement(noise)
        if self.noise != "distributed" and self.tolerate:
            raise ConfigError(f"tolerate = {tolerate} only applies to distributed noise (got noise = {noise!r})")
        self.participation = _Participation()

    def setup(self, ctx: SetupContext) -> None:
        if self.noise == "local":
            self.participation.setup(ctx.n_clients)

    def state_dict(self) -> dict[str, Any]:
        return {"participation": self.participation.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participation.load(state["participation"])

    def describe(self) -> str:
        tol = f", l={self.tolerate}" if self.tolerate else ""
        wor = self.without_replacement
        q = f"q={self.q:.6g}" if wor is None else f"{wor[1]} of {wor[0]} without replacement"
        return f"{self.label}(σ={self.sigma:.6g}, {self.noise}{tol}, {q})"


class GaussianNoiseStep(_NoiseStep):
    """Gaussian noise for client-level DP with sensitivity S (read from `clip`), multiplier σ.

    distributed: share G(0, (Sσ)²/(k − l)) per client; local: G(0, (Sσ)²) per client;
    central: the server adds G(0, (Sσ)²) to the sum (to the mean: G(0, (Sσ/|K|)²)).
    Draws come from a CryptoRNG per (round, client) (per round for the server).
    """

    name, label = "gaussian_noise", "gaussian"

    def __init__(self, sigma: float, clip: ClipStep, q: float, tolerate: int = 0, noise: str = "distributed",
                 without_replacement: tuple[int, int] | None = None):
        super().__init__(sigma, q, tolerate, noise)
        self.clip = clip
        # (N, |K|): the round samples |K| of N clients without replacement (else Poisson with rate q)
        self.without_replacement = without_replacement
        # adaptive clipping: the rows end with the count value b − ½, noised with σ_b in all; σ stays the
        # joint multiplier the ledger records, the update's noise is σ_Δ (`adaptive_update_sigma`)
        self.count_sigma: float | None = getattr(clip, "count_sigma", None)
        self.update_sigma = self.sigma if self.count_sigma is None else adaptive_update_sigma(sigma, self.count_sigma)

    def share_std(self, k: int) -> float:
        """Std of one client's share for a round with k answering clients (0 for central)."""
        full = self.clip.bound * self.update_sigma
        if self.noise == "distributed":
            return full / math.sqrt(shares(k, self.tolerate))
        return full if self.noise == "local" else 0.0

    def mean_noise_std(self, ctx: RoundContext) -> float:
        """Per-coordinate std of the noise in this round's DP mean (all k shares added)."""
        k = ctx.k()
        total = self.clip.bound * self.update_sigma if self.noise == "central" else self.share_std(k) * math.sqrt(k)
        return total / dp_denominator(ctx)

    def count_share_std(self, k: int) -> float:
        """Std of one client's share of the adaptive clip count's noise σ_b (0 for central)."""
        if self.noise == "distributed":
            return self.count_sigma / math.sqrt(shares(k, self.tolerate))
        return self.count_sigma if self.noise == "local" else 0.0

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if self.count_sigma is None:
            return self._shares(u, ctx)
        # adaptive clipping: the update's shares as without it, then the count value's own share
        return torch.cat([self._shares(u[:, :-1].contiguous(), ctx), self._count_shares(u[:, -1:], ctx)], 1)

    def _count_shares(self, b: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        """The count values b − ½ [k, 1] plus each client's share of N(0, σ_b²), from its own stream."""
        k = ctx.k()
        std = self.count_share_std(k)
        ctx.metrics["dp_count_share_std"] = std
        if std == 0.0:
            return b
        skip = _omitted(ctx, k)
        rows = [i for i in range(len(ctx.cohort)) if not skip[i]]
        z = torch.zeros(len(ctx.cohort), 1, dtype=torch.float64, device=b.device)
        if rows:
            part = torch.empty(len(rows), 1, dtype=torch.float64, device=b.device)
            gaussian_rows([ctx.seeds.crypto("round", ctx.round, "dp-count-share", int(ctx.cohort[i])) for i in rows],
                          part, std)
            z[torch.tensor(rows, device=b.device)] = part
        return z.add_(b.to(torch.float64)).to(b.dtype)

    def _shares(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        k = ctx.k()
        if self.noise == "central":
            return u
        t0 = time.perf_counter()
        std = self.share_std(k)
        skip = _omitted(ctx, k)
        out = u.detach().clone()
        rows = [i for i in range(len(ctx.cohort)) if not skip[i]]
        # each client's share from its own stream, on the update's device (the same values on any
        # device, and in any number of threads); noise + update summed in float64, then rounded
        n = out.shape[1]
        step = max(1, min(len(rows), (1 << 26) // max(1, n))) if out.device.type != "cpu" else workers()
        for s in range(0, len(rows), step):
            part = rows[s : s + step]
            z = torch.empty(len(part), n, dtype=torch.float64, device=out.device)
            gaussian_rows([ctx.seeds.crypto("round", ctx.round, "dp-share", int(ctx.cohort[i])) for i in part], z, std)
            sel = torch.tensor(part, device=out.device)
            out[sel] = z.add_(out[sel]).to(out.dtype)
        if out.device.type == "cuda":
            torch.cuda.synchronize(out.device)  # dp_noise_seconds counts the draw, not its launch
        if self.noise == "local":
            self.participation.record(np.asarray(ctx.cohort))
        ctx.metrics["dp_noise_shares"] = int(k - skip.sum())
        ctx.metrics["dp_share_std"] = std
        ctx.metrics["dp_noise_seconds"] = time.perf_counter() - t0
        return out.to(u.device)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if self.noise != "distributed" or ctx.k() > self.tolerate:  # (else the round released nothing)
            ctx.dp_noise_std = self.mean_noise_std(ctx)  # for later server steps (FL-CS's λ = "noise")
        if self.noise != "central":
            return agg
        std = self.clip.bound * self.update_sigma / dp_denominator(ctx)
        n = agg.numel() - (self.count_sigma is not None)  # (the adaptive clip's count value last)
        z = gaussian_noise(n, std, ctx.seeds.crypto("round", ctx.round, "dp-central"))
        if self.count_sigma is not None:
            zb = gaussian_noise(1, self.count_sigma / dp_denominator(ctx),
                                ctx.seeds.crypto("round", ctx.round, "dp-central-count"))
            z = np.concatenate([z, zb])
        return (agg.to("cpu", torch.float64) + torch.from_numpy(z)).to(agg.device, agg.dtype)

    def privacy_events(self, ctx: RoundContext) -> list[Any]:
        if self.noise == "local":
            return [GaussianEvent(self.sigma / 2)] if self.participation.grows(np.asarray(ctx.cohort)) else []
        if self.without_replacement is not None:
            return [SampledWithoutReplacementGaussianEvent(self.sigma, *self.without_replacement)]
        return [SampledGaussianEvent(self.sigma, self.q)]

    def describe(self) -> str:
        out = super().describe()
        if self.count_sigma is None:
            return out
        return f"{out[:-1]}, joint: update σ_Δ={self.update_sigma:.6g}, count σ_b={self.count_sigma:.6g})"


class CorrelatedNoiseStep(GaussianNoiseStep):
    """Correlated Gaussian noise across rounds: DP-FTRL's tree aggregation or BandMF
    (`dpfl.privacy.factorization`). Round t's sum gets S·σ·z̃_t, z̃ = F Z with Z's rows N(0, 1) vectors
    from the run's CryptoRNG keys (`dpfl.privacy.correlated`): the model's prefix sums carry B Z, and the
    run is the Gaussian mechanism on C x with multiplier σ/Δ, Δ the factorization's sensitivity under the
    participation schema.

    central: the (trusted) server adds S·σ·z̃_t/|K| to the DP mean; BandMF keeps b − 1 rows of z̃ as
    state (checkpointed). distributed: every one of the N clients takes part in every round and adds
    S·σ/√N·(F Z⁽ⁱ⁾)_t from its own streams inside the secure sum: Σᵢ F Z⁽ⁱ⁾ = F Σᵢ Z⁽ⁱ⁾ with
    Σᵢ Z⁽ⁱ⁾ ~ N(0, I): the same mechanism, and no party learns the noise (tree, or BandMF with b = 1,
    the only BandMF that such a schema allows; both stateless per client).
    Events: round t adds GaussianEvent(σ/√(Δ_t² − Δ²_accounted)) (ρ adds up to Δ_t²/(2σ²)); a round
    that released nothing is charged at the next one that does."""

    name = "correlated_noise"

    def __init__(self, sigma: float, clip: ClipStep, mf: Any, sens2: np.ndarray, exact: bool,
                 participation: tuple[str, int], noise: str = "central"):
        from dpfl.privacy.correlated import stream

        super().__init__(sigma, clip, 1.0, 0, noise)
        if self.count_sigma is not None:
            raise ConfigError("clip = 'adaptive' does not combine with correlated noise")
        self.mf, self.sens2, self.exact, self.participation_schema = mf, np.asarray(sens2), exact, participation
        self.label = mf.name
        self.round_std = mf.round_std()  # ‖F_t‖: round t's noise std per unit of S·σ
        self.stream = stream(mf)
        self.accounted = 0.0  # Δ² charged so far
        self.pending = 0.0  # Δ² charged once this round releases
        self.n_clients = 0
        self._width = 0  # values per row (the noise vectors' length)

    def setup(self, ctx: SetupContext) -> None:
        super().setup(ctx)
        self.n_clients = ctx.n_clients

    def _check_round(self, r: int) -> None:
        if not 1 <= r <= self.mf.rounds:
            raise ConfigError(f"round {r}: the correlated noise was built for {self.mf.rounds} rounds")

    def share_std(self, k: int) -> float:
        """Distributed: the largest round's share std S·σ·max‖F_t‖/√k (the secure sum's range)."""
        if self.noise != "distributed":
            return 0.0
        return self.clip.bound * self.sigma * float(self.round_std.max()) / math.sqrt(shares(k, 0))

    def mean_noise_std(self, ctx: RoundContext) -> float:
        return self.clip.bound * self.sigma * float(self.round_std[ctx.round - 1]) / dp_denominator(ctx)

    def _unit(self, ctx: RoundContext, *path: object) -> Callable[[tuple], torch.Tensor]:
        """key -> a float64 [d] vector of N(0, 1) from the CryptoRNG stream of (path, key)."""
        def draw(key: tuple) -> torch.Tensor:
            out = torch.empty(self._width, dtype=torch.float64)
            return ctx.seeds.crypto(*path, self.mf.name, *key).gaussian_into(out, 1.0)

        return draw

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        self._check_round(ctx.round)
        if self.noise != "distributed":
            return u
        k = ctx.k()
        if k != self.n_clients:
            raise RoundAborted(f"round {ctx.round}: distributed correlated noise needs all {self.n_clients} "
                               f"clients' shares, {k} answered: nothing released")
        t0 = time.perf_counter()
        self._width = u.shape[1]
        std = self.clip.bound * self.sigma / math.sqrt(k)  # Z⁽ⁱ⁾ ~ N(0, (Sσ)²/N) per client
        skip = _omitted(ctx, k)
        out = u.detach().clone()
        for i, c in enumerate(ctx.cohort):
            if skip[i]:
                continue
            draw = self._unit(ctx, "dp-mf-share", int(c))
            z = self.stream.noise(ctx.round, draw) if self.mf.name == "tree" else draw((ctx.round,))
            out[i] = z.mul_(std).add_(out[i].to("cpu", torch.float64)).to(out.device, out.dtype)
        ctx.metrics["dp_noise_shares"] = int(k - skip.sum())
        ctx.metrics["dp_share_std"] = std * float(self.round_std[ctx.round - 1])
        ctx.metrics["dp_noise_seconds"] = time.perf_counter() - t0
        return out

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        self._check_round(ctx.round)
        ctx.dp_noise_std = self.mean_noise_std(ctx)
        ctx.metrics["dp_noise_std"] = ctx.dp_noise_std
        ctx.metrics["dp_mf_sensitivity"] = math.sqrt(float(self.sens2[ctx.round - 1]))
        self.accounted = self.pending  # the round released: its event is in the ledger
        if self.noise != "central":
            return agg
        t0 = time.perf_counter()
        self._width = agg.numel()
        z = self.stream.noise(ctx.round, self._unit(ctx, "dp-mf"))
        z.mul_(self.clip.bound * self.sigma / dp_denominator(ctx))
        ctx.metrics["dp_noise_seconds"] = time.perf_counter() - t0
        return (agg.to("cpu", torch.float64) + z).to(agg.device, agg.dtype)

    def privacy_events(self, ctx: RoundContext) -> list[Any]:
        from dpfl.privacy.factorization import round_event

        self._check_round(ctx.round)
        event, self.pending = round_event(self.sigma, self.sens2, self.accounted, ctx.round)
        return [] if event is None else [event]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds": self.mf.rounds, "accounted": self.accounted,
                "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["rounds"] != self.mf.rounds:
            raise ValueError(f"the correlated noise was built for {state['rounds']} rounds, this run has "
                             f"{self.mf.rounds}: a run with correlated noise keeps federation.rounds")
        super().load_state_dict(state)
        self.accounted = self.pending = float(state["accounted"])
        self.stream.load_state_dict(state["stream"])

    def describe(self) -> str:
        schema, sep = self.participation_schema
        if self.mf.name == "tree":
            what = (f"restart={self.mf.segments[0] if len(self.mf.segments) > 1 else 'none'}, "
                    f"completion={'on' if self.mf.completion else 'off'}")
        else:
            what = f"bands={self.mf.bands}"
        part = schema if schema == "any" else f"{schema} b={sep}"
        delta = math.sqrt(float(self.sens2[-1]))
        return (f"{self.label}(σ={self.sigma:.6g}, {self.noise}, {what}, {part}: Δ={delta:.6g} "
                f"{'exact' if self.exact else 'upper bound'}, σ/Δ={self.sigma / delta:.6g})")


def correlated_noise(dp: Any, clip: ClipStep, prefix: Sequence[Any] = ()) -> CorrelatedNoiseStep:
    """The correlated noise step of `dp` (a `DPOptions` with `correlated` set): the factorization, its
    sensitivity under the run's participation schema, and σ (given, or calibrated on the run's events after
    `prefix` for dp.epsilon)."""
    from dpfl.privacy import factorization as mf

    schema, sep = dp.participation
    f, sens2, exact = mf.build(dp.correlated, dp.rounds, schema, sep, bands=dp.bands, restart=dp.restart,
                               completion=dp.completion is not False, workload_momentum=dp.workload_momentum)
    sigma = dp.sigma if dp.sigma is not None else mf.calibrate(dp.epsilon, dp.delta, sens2, dp.accountant, prefix)
    return CorrelatedNoiseStep(sigma, clip, f, sens2, exact, (schema, sep), dp.noise)


def _check_int32(largest: int, xi: float) -> None:
    """Integer share rows are int32 (half the memory of int64): checked, never wrapped."""
    if largest > np.iinfo(np.int32).max:
        raise ConfigError(f"discrete Gaussian share (std {xi:.4g}) does not fit int32 rows")


class DiscreteGaussianShareStep(_NoiseStep):
    """FL-SIGN-DP noise on integer rows μ = sign(Δw) ∈ {±1}ⁿ (sensitivity √n).

    distributed: z_k ~ DG(μ_k, √n·σ/√(k − l)); local: DG(μ_k, √n·σ); central: the server adds
    DG(0, √n·σ) to the integer sum. Exact-table sampler `discrete_gaussian` (its TV distance
    from the exact DG goes into the event and from there into δ).
    """

    name = label = "discrete_gaussian"

    def share_std(self, n: int, k: int) -> float:
        full = math.sqrt(n) * self.sigma
        if self.noise == "distributed":
            return full / math.sqrt(shares(k, self.tolerate))
        return full

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if u.is_floating_point():
            raise ConfigError(f"the discrete Gaussian share needs integer sign rows, got {u.dtype}")
        n = u.shape[1]
        k = ctx.k()
        if self.noise == "central":
            return u
        mu = u.detach().numpy() if u.device.type == "cpu" else None
        t0 = time.perf_counter()
        xi = self.share_std(n, k)
        skip = _omitted(ctx, k)
        if u.device.type != "cpu":  # the same values, drawn where the rows are
            out_t = u.detach().to(torch.int32, copy=True)
            rows = [i for i in range(k) if not skip[i]]
            step = max(1, min(len(rows), (1 << 25) // max(1, n)))
            for s in range(0, len(rows), step):
                sel = torch.tensor(rows[s : s + step], device=u.device)
                z = discrete_gaussian_rows(u.detach()[sel], xi, [ctx.seeds.crypto("round", ctx.round, "dp-share",
                                                                                  int(ctx.cohort[i]))
                                                                  for i in rows[s : s + step]])
                _check_int32(int(z.abs().max()) if z.numel() else 0, xi)
                out_t[sel] = z.to(torch.int32)
        else:
            out = mu.astype(np.int32)  # int32 rows: half the memory of int64 (checked, never wrapped)
            for i, c in enumerate(ctx.cohort):  # row by row: bounded int64 memory
                if not skip[i]:
                    z = discrete_gaussian(mu[i], xi,  # integer mean of any width: added in int64
                                          ctx.seeds.crypto("round", ctx.round, "dp-share", int(c)))
                    _check_int32(max(-int(z.min()), int(z.max())) if z.size else 0, xi)
                    out[i] = z
            out_t = torch.from_numpy(out)
        if self.noise == "local":
            self.participation.record(np.asarray(ctx.cohort))
        ctx.metrics["dp_noise_shares"] = int(k - skip.sum())
        ctx.metrics["dp_share_std"] = xi
        ctx.metrics["dp_noise_seconds"] = time.perf_counter() - t0
        return out_t.to(u.device)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        if self.noise != "central":
            return agg
        n = agg.numel()
        z = discrete_gaussian(np.zeros(n, dtype=np.int64), math.sqrt(n) * self.sigma,
                              ctx.seeds.crypto("round", ctx.round, "dp-central"))
        return (agg.to("cpu", torch.float64) + torch.from_numpy(z).to(torch.float64)).to(agg.device, agg.dtype)

    def event(self, n: int, k: int, q: float | None = None) -> DiscreteGaussianEvent:
        """The round's event for n coordinates and k answering clients (distributed/central)."""
        q = self.q if q is None else q
        if self.noise == "distributed":
            m = shares(k, self.tolerate)
            return DiscreteGaussianEvent(self.sigma, q, n, m, sampler_tv=k * n * sampler_tv_bound(self.share_std(n, k)))
        return DiscreteGaussianEvent(self.sigma, q, n, 1, sampler_tv=n * sampler_tv_bound(self.share_std(n, k)))

    def privacy_events(self, ctx: RoundContext) -> list[Any]:
        n, k = ctx.n_params, len(ctx.cohort)
        if self.noise == "local":
            if not self.participation.grows(np.asarray(ctx.cohort)):
                return []
            # sensitivity between two sign vectors is 2√n: multiplier σ/2 (κ is evaluated at the
            # smaller ξ = √n·σ/2, which only enlarges the correction); one client's samples
            return [DiscreteGaussianEvent(self.sigma / 2, 1.0, n, 1,
                                          sampler_tv=n * sampler_tv_bound(self.share_std(n, k)))]
        if self.noise == "distributed" and k - self.tolerate < 1:
            return []  # the round aborts in `client` and releases nothing
        return [self.event(n, k)]



class DPMeanAggregator(Aggregator):
    """(1/|K|) Σ_k rows with |K| the public expected cohort size (thesis Alg. 10–14; a fixed
    denominator keeps the sum's sensitivity S whatever the random number of participants)."""

    name = "dp_mean"

    def __call__(self, rec: Received, ctx: RoundContext) -> torch.Tensor:
        return (rec.total.to(torch.float64) / dp_denominator(ctx)).to(torch.float32)
