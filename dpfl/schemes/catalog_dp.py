"""The client-level DP schemes of thesis ch. 5 (Algorithms 9–14), registered by name: each is its
non-DP scheme through `dp_wrapper.make_private`, with the options of `dp_options.DPOptions`.

    fl-std-dp    clip → noise                       | mean
    fl-sign-dp   sign → discrete Gaussian share     | γ·sign of the sum   (S = √n)
    fl-cs-dp     DCT compress → clip → noise        | mean → momentum, error feedback, BPDN
    fl-rnd-dp    random subset → clip → noise       | mean → scatter
    fl-freq-dp   low-pass DCT → clip → noise        | mean → inverse DCT
    fl-top-dp    Top-K (public data) → clip → noise | mean → scatter
    fl-basic-dp  random trainable subset → clip → noise | mean → scatter

Options shared by all (see docs/dp-schemes.md):
  sigma | epsilon   noise multiplier σ, or a target ε: σ calibrated with privacy.accountant
                    for q = sampling rate, T = federation.rounds, privacy.delta (and the clip
                    selection's cost when clip = "private"); `--set privacy.accountant=pld`
                    therefore re-calibrates σ to the same ε with the tight accountant.
                    Client selection is accounted as the run's `sampling` (env, from
                    RunConfig.accounted_sampling): Poisson (add/remove neighbours), a fixed-size
                    cohort without replacement (replace-one neighbours), or none (q = 1, local noise).
  clip              S, or "auto" (the thesis heuristic, not charged), or "private" (DP median,
                    charged), or "adaptive" (Andrew et al. 2021: S follows the clip_quantile of the
                    norms from a noisy count, clip_lr, clip_init, clip_count_sigma; σ is then the joint
                    multiplier, see dp.adaptive_update_sigma); clip_clients: initialisation-round
                    clients (default all N); clip_epsilon: ε₀ of the private median.
  tolerate          l, client failures after masking the noise still covers.
  noise             "distributed" (secure aggregation) | "central" | "local".
  secure_aggregation, neighbours, threshold, drop_after_masking, frac_bits: secure sum options
                    (secure_aggregation defaults to true for distributed noise, false otherwise;
                    false with distributed noise simulates it without masking:
                    the server then sees weakly-noised rows; the stated ε assumes masking).
"""

from __future__ import annotations

from dpfl.schemes import sensitivity
from dpfl.schemes.aggregators import MeanAggregator
from dpfl.schemes.catalog import fl_basic, fl_freq, fl_rnd, fl_sign, fl_top
from dpfl.schemes.cs import CompressiveSensingStep
from dpfl.schemes.dp_options import DPOptions, register_dp
from dpfl.schemes.dp_wrapper import make_private
from dpfl.schemes.registry import Scheme, fl_std
from dpfl.schemes.transport import PlainTransport


@register_dp("fl-std-dp")
def fl_std_dp(dp: DPOptions) -> Scheme:
    return make_private(fl_std(), dp)


@register_dp("fl-sign-dp", mechanism="discrete")
def fl_sign_dp(dp: DPOptions, gamma: float = 0.005) -> Scheme:
    return make_private(fl_sign(gamma), dp)


@register_dp("fl-cs-dp")
def fl_cs_dp(dp: DPOptions, ratio: float = 0.05, chunks: int = 200, lam: float | str = 1e-5,
             server_lr: float = 0.35, momentum: float = 0.9, max_iter: int = 1000, tol: float = 3e-3,
             lam_scale: float = 1.0, error_feedback: bool = True) -> Scheme:
    cs = CompressiveSensingStep(ratio, chunks, lam, server_lr, momentum, max_iter, tol, lam_scale, error_feedback)
    return make_private(Scheme("fl-cs", [cs], PlainTransport(), MeanAggregator()), dp)


@register_dp("fl-rnd-dp")
def fl_rnd_dp(dp: DPOptions, ratio: float = 0.05) -> Scheme:
    return make_private(fl_rnd(ratio), dp)


@register_dp("fl-freq-dp")
def fl_freq_dp(dp: DPOptions, ratio: float = 0.05, layout: str = "pytorch") -> Scheme:
    return make_private(fl_freq(ratio, layout), dp)


@register_dp("fl-top-dp")
def fl_top_dp(dp: DPOptions, ratio: float = 0.005, init_steps: int = 5, init_lr: float = 0.215,
              task: str = "multiclass") -> Scheme:
    base = fl_top(ratio, init_steps, init_lr, task)
    top = base.steps[0]
    return make_private(base, dp, auto_clip=lambda ctx: sensitivity.public_topk(ctx, top.indices))


@register_dp("fl-basic-dp")
def fl_basic_dp(dp: DPOptions, ratio: float = 0.005, clip_repeats: int = 100) -> Scheme:
    base = fl_basic(ratio)
    sub = base.steps[0]
    return make_private(base, dp, auto_clip=lambda ctx: sensitivity.public_random(ctx, sub.k, clip_repeats))
