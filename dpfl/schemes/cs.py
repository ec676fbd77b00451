"""FL-CS (thesis Alg. 4, scalable variant) and the FL-FREQ baseline (Alg. 6).

FL-CS  = [CompressiveSensingStep] | PlainTransport(float32) | MeanAggregator
FL-FREQ = [LowPassDCTStep]        | PlainTransport(float32) | (weighted) mean

Both compress with the first DCT coefficients (dpfl.compression.dct.ChunkedDCT), so by
linearity the mean of the clients' compressed updates *is* the compression of their mean: the
server keeps momentum and error feedback in the compressed domain (size m) and reconstructs
once per round.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpfl.compression.cs import bpdn
from dpfl.compression.dct import ChunkedDCT
from dpfl.compression.subset import count_for_ratio
from dpfl.errors import ConfigError
from dpfl.models.keras_init import keras_order
from dpfl.schemes.base import RoundContext, SetupContext, Step


class CompressiveSensingStep(Step):
    """Client: y_k = C(Δw_k, m) — seed-shared permutation, P chunks, first m_j DCT coefficients each.

    Server, on the mean y_t of the received vectors (Alg. 4 lines 8–13):
        u_t = ρ u_{t−1} + y_t;  e_t = η_G u_t + e_{t−1};  s_t = D(e_t, n) (BPDN, λ);
        e_t ← e_t − C(s_t, m);  returns s_t (the engine adds it to w).

    λ = "noise" (DP versions only): λ_t is the universal threshold of the fresh DP noise in
    η_G u_t, τ_t·√(m/n)·√(2 ln n) with τ_t its per-coefficient std (tracked through the
    momentum from `ctx.dp_noise_std`, the std of the noise in the mean y_t, which the DP noise
    step sets in the round's context before this step's `server` runs). Thesis λ = 1e-5 makes
    BPDN interpolate that noise with a sparse vector of large entries (‖s‖ several times
    ‖e_t‖, single weights moved by ~0.9 after 5 rounds of pure noise), which wrecks the
    model; at the universal threshold, pure noise reconstructs to s = 0 with high probability.
    `lam_scale` multiplies that threshold (1: universal; below 1 lets some noise through and
    shrinks the signal less).

    `error_feedback = False` (a probe of the thesis's Alg. 4, which keeps it) drops what the
    decoder left out, e_t ← 0, instead of carrying it into the next round: with DP, error
    feedback eventually applies all the noise it holds, in sparse bursts at λ.
    """

    name = "cs"

    def __init__(self, ratio: float, chunks: int = 200, lam: float | str = 1e-5, server_lr: float = 0.35,
                 momentum: float = 0.9, max_iter: int = 1000, tol: float = 1e-2, lam_scale: float = 1.0,
                 error_feedback: bool = True):
        if not isinstance(error_feedback, bool):
            raise ConfigError(f"FL-CS error_feedback must be true or false, got {error_feedback!r}")
        if isinstance(lam, str):
            if lam != "noise":
                raise ConfigError(f"FL-CS λ must be a number > 0 or 'noise', got {lam!r}")
        elif isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam > 0:
            raise ConfigError(f"FL-CS λ must be a number > 0 or 'noise', got {lam!r}")
        if isinstance(lam_scale, bool) or not isinstance(lam_scale, (int, float)) or not lam_scale > 0:
            raise ConfigError(f"FL-CS lam_scale must be a number > 0, got {lam_scale!r}")
        if lam_scale != 1 and lam != "noise":
            raise ConfigError("FL-CS lam_scale scales λ = 'noise' only; give a numeric λ directly instead")
        if not server_lr > 0:
            raise ConfigError(f"FL-CS global learning rate η_G must be > 0, got {server_lr}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"FL-CS momentum ρ must be in [0, 1), got {momentum}")
        self.ratio, self.chunks, self.lam = ratio, int(chunks), lam if isinstance(lam, str) else float(lam)
        self.lam_scale, self.error_feedback = float(lam_scale), error_feedback
        self.noise_var = 0.0  # per-coefficient variance of the DP noise in the momentum u
        self.server_lr, self.momentum = float(server_lr), float(momentum)
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.op: ChunkedDCT | None = None
        self.u: torch.Tensor | None = None  # momentum, compressed domain [m]
        self.e: torch.Tensor | None = None  # error feedback, compressed domain [m]

    def setup(self, ctx: SetupContext) -> None:
        n = ctx.n_params
        m = count_for_ratio(self.ratio, n)
        perm = ctx.seeds.numpy("cs", "permutation").permutation(n)  # shared by all, fixed for the run
        self.op = ChunkedDCT(n, m, self.chunks, perm)
        if self.u is None:
            self.u = torch.zeros(m, dtype=torch.float32, device=ctx.device)
            self.e = torch.zeros(m, dtype=torch.float32, device=ctx.device)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return self.op.compress(u.to(torch.float32))

    def _lambda(self, ctx: RoundContext) -> float:
        if self.lam != "noise":
            return self.lam
        if ctx.dp_noise_std is None:
            raise ConfigError("FL-CS λ = 'noise' needs a DP scheme (fl-cs-dp) that knows its noise level")
        self.noise_var = self.momentum**2 * self.noise_var + float(ctx.dp_noise_std) ** 2
        n, m = self.op.n, self.op.m
        return max(self.lam_scale * self.server_lr * math.sqrt(self.noise_var * m / n * 2 * math.log(n)), 1e-12)

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        y = agg.to(torch.float32)
        lam = self._lambda(ctx)
        self.u = self.momentum * self.u.to(y.device) + y
        e = self.server_lr * self.u + self.e.to(y.device)
        s, info = bpdn(self.op, e, lam, max_iter=self.max_iter, tol=self.tol)
        self.e = e - self.op.compress(s.unsqueeze(0))[0]
        error_norm = float(self.e.norm())
        if not self.error_feedback:
            self.e = torch.zeros_like(self.e)
        ctx.metrics.update({"cs_iterations": info.iterations, "cs_converged": float(info.converged),
                            "cs_nonzeros": int((s != 0).sum()),
                            "cs_error_norm": error_norm, "cs_lambda": lam})
        return s

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.u.cpu().clone(), "error": self.e.cpu().clone(), "noise_var": self.noise_var}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u, self.e = state["momentum"].clone(), state["error"].clone()
        self.noise_var = float(state.get("noise_var", 0.0))

    def describe(self) -> str:
        lam = self.lam if self.lam_scale == 1 else f"{self.lam_scale:g}·{self.lam}"
        ef = "" if self.error_feedback else ", no error feedback"
        return (f"cs(r={self.ratio}, P={self.chunks}, λ={lam}, η_G={self.server_lr}, ρ={self.momentum}, "
                f"BPDN tol={self.tol}{ef})")


class LowPassDCTStep(Step):
    """FL-FREQ: clients send the first m DCT coefficients of the whole update (no permutation, one
    chunk); the server applies the inverse DCT with the other coefficients zeroed (low-pass).

    Which weights a low-pass can move depends on the order they are flattened in: `layout =
    "keras"` takes the DCT over the Keras 2.2 order of the thesis's software
    (`dpfl.models.keras_init.keras_order`) instead of this library's."""

    name = "freq"

    def __init__(self, ratio: float, layout: str = "pytorch"):
        if layout not in ("pytorch", "keras"):
            raise ConfigError(f"fl-freq: layout must be 'pytorch' or 'keras', got {layout!r}")
        self.ratio, self.layout = ratio, layout
        self.op: ChunkedDCT | None = None

    def setup(self, ctx: SetupContext) -> None:
        perm = None
        if self.layout == "keras":
            if ctx.model is None:
                raise ConfigError("fl-freq: layout = 'keras' needs the model")
            perm = keras_order(ctx.model).numpy()
            if perm.size != ctx.n_params:
                raise ConfigError(f"fl-freq: the model has {perm.size} weights, the run {ctx.n_params}")
        self.op = ChunkedDCT(ctx.n_params, count_for_ratio(self.ratio, ctx.n_params), 1, perm)

    def client(self, u: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return self.op.compress(u.to(torch.float32))

    def server(self, agg: torch.Tensor, ctx: RoundContext) -> torch.Tensor:
        return self.op.adjoint(agg.to(torch.float32))

    def describe(self) -> str:
        return f"freq(r={self.ratio})" if self.layout == "pytorch" else f"freq(r={self.ratio}, keras layout)"
