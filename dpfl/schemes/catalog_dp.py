"""The client-level DP schemes of thesis ch. 5 (Algorithms 9–14), registered by name.

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
                    charged); clip_clients: initialisation-round clients (default all N);
                    clip_epsilon: ε₀ of the private median.
  tolerate          l, client failures after masking the noise still covers.
  noise             "distributed" (secure aggregation) | "central" | "local".
  secure_aggregation, neighbours, threshold, drop_after_masking, frac_bits: secure sum options
                    (secure_aggregation defaults to true for distributed noise, false otherwise;
                    false with distributed noise simulates it without masking:
                    the server then sees weakly-noised rows; the stated ε assumes masking).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpfl.compression.base import Float32Codec
from dpfl.compression.bits import SignCodec
from dpfl.errors import ConfigError
from dpfl.privacy import (
    DiscreteGaussianEvent,
    Event,
    GaussianEvent,
    Ledger,
    SampledGaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    calibrate_sigma,
    sampler_tv_bound,
)
from dpfl.privacy import rdp as R
from dpfl.privacy.ledger import SUPPORTED_SAMPLINGS
from dpfl.schemes import sensitivity
from dpfl.schemes.aggregators import SumAggregator
from dpfl.schemes.base import SetupContext, Step, Transport
from dpfl.schemes.cs import CompressiveSensingStep, LowPassDCTStep
from dpfl.schemes.dp import (
    Clip,
    DiscreteGaussianShare,
    DPMeanAggregator,
    GaussianNoise,
    PlainDP,
    SecureSum,
    check_placement,
    check_tolerate,
)
from dpfl.schemes.registry import Scheme, register
from dpfl.schemes.sign import SignStep
from dpfl.schemes.subset import RandomSubsetStep
from dpfl.schemes.topk import TopKStep

# ---- σ ------------------------------------------------------------------------------------


def calibrated_sigma(epsilon: float, privacy: Any, q: float, rounds: int,
                     event: Callable[[float], Event] | None = None, prefix: tuple[Event, ...] = (),
                     neighbouring: str = "add_remove") -> float:
    """Smallest σ (to 1e-5 relative, rounded up) with ε(prefix + rounds × event(σ)) ≤ epsilon at
    privacy.delta under privacy.accountant and `neighbouring`. Starts from `calibrate_sigma`
    (Poisson-sampled Gaussian) and checks, on a ledger, the events the run will actually record."""
    acc, delta = privacy.accountant, privacy.delta
    s = calibrate_sigma(epsilon, delta, q, rounds, acc)
    if event is None and not prefix:
        return s
    event = event or (lambda x: SampledGaussianEvent(x, q))

    def eps(x: float, orders=None) -> float:
        led = Ledger(acc, neighbouring, orders=orders)
        for e in prefix:
            led.add(e)
        led.add(event(x), count=rounds)
        return led.epsilon(delta)

    if neighbouring == "add_remove":
        if eps(s) <= epsilon:
            return s  # the events only add to the sampled Gaussian's ε: s is the smallest
        return _bisect(eps, *_bracket(eps, s, epsilon), epsilon)[1]
    # another relation (sampling without replacement): s is only a starting point. Under rdp the
    # search runs on the orders <= 64 (fast; their ε is >= the full grid's), then the full grid
    # confirms that σ / (1 + 1e-5) is not enough there either.
    fast = (lambda x: eps(x, R.DEFAULT_ORDERS[R.DEFAULT_ORDERS <= 64])) if acc == "rdp" else eps
    lo, hi = _bisect(fast, *_bracket(fast, s, epsilon), epsilon)
    if fast is eps or eps(lo) > epsilon:
        return hi
    return _bisect(eps, *_bracket(eps, lo, epsilon), epsilon)[1]


def _bracket(eps: Callable[[float], float], s: float, epsilon: float) -> tuple[float, float]:
    """(lo, hi) around s with eps(lo) > epsilon >= eps(hi)."""
    if eps(s) <= epsilon:
        lo, hi = s / 2, s
        while eps(lo) <= epsilon:
            lo, hi = lo / 2, lo
            if lo < 1e-4:
                raise ConfigError(f"ε = {epsilon} is reached for every σ ≥ 1e-4 with these events")
        return lo, hi
    lo, hi = s, s * 1.05
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e7:
            raise ConfigError(f"no σ ≤ 1e7 reaches ε = {epsilon} with these events")
    return lo, hi


def _bisect(eps: Callable[[float], float], lo: float, hi: float, epsilon: float) -> tuple[float, float]:
    while hi / lo > 1 + 1e-5:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return lo, hi


def _sigma_or_epsilon(name: str, sigma: float | None, epsilon: float | None) -> None:
    if (sigma is None) == (epsilon is None):
        raise ConfigError(f"scheme {name!r}: give exactly one of sigma (noise multiplier) or epsilon (target ε)")
    for key, v in (("sigma", sigma), ("epsilon", epsilon)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"scheme {name!r}: {key} must be a finite number > 0, got {v!r}")


# ---- pieces shared by the Gaussian schemes ------------------------------------------------------


def _clip_step(name: str, clip: float | str, compress: list[Step], auto: Callable[[SetupContext], tuple[float, str]],
               clip_clients: int | None, clip_epsilon: float, neighbouring: str) -> tuple[Clip, tuple[Event, ...]]:
    """The Clip step for option `clip`, and the events its selection charges (under `neighbouring`)."""
    if isinstance(clip, str):
        if clip == "auto":
            return Clip(selector=auto), ()
        if clip == "private":
            if isinstance(clip_epsilon, bool) or not isinstance(clip_epsilon, (int, float)) or not clip_epsilon > 0:
                raise ConfigError(f"scheme {name!r}: clip_epsilon must be > 0, got {clip_epsilon!r}")
            eps0 = float(clip_epsilon)
            return Clip(selector=lambda ctx: sensitivity.private_median(ctx, compress, eps0, clip_clients)), \
                (sensitivity.private_median_event(eps0, neighbouring),)
        raise ConfigError(f"scheme {name!r}: clip must be a number > 0, 'auto' or 'private', got {clip!r}")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)):
        raise ConfigError(f"scheme {name!r}: clip must be a number > 0, 'auto' or 'private', got {clip!r}")
    return Clip(float(clip)), ()


def _transport(noise_step, noise: str, secure_aggregation: bool, neighbours, threshold, drop_after_masking,
               frac_bits, plain_codec=None) -> Transport:
    if secure_aggregation is None:  # default: on exactly for distributed noise
        secure_aggregation = noise == "distributed"
    if not isinstance(secure_aggregation, bool):
        raise ConfigError(f"secure_aggregation must be true or false, got {secure_aggregation!r}")
    secagg_opts = {"neighbours": neighbours, "threshold": threshold, "frac_bits": frac_bits}
    if noise == "distributed" and secure_aggregation:
        return SecureSum(noise_step, neighbours=neighbours, threshold=threshold,
                         drop_after_masking=drop_after_masking, frac_bits=frac_bits)
    if drop_after_masking:
        raise ConfigError("drop_after_masking needs distributed noise with secure aggregation")
    if noise != "distributed" and secure_aggregation:
        raise ConfigError(f"noise = {noise!r} sends rows in plain: secure_aggregation must be false "
                          "(secure aggregation goes with distributed noise)")
    set_opts = [k for k, v in secagg_opts.items() if v is not None]
    if set_opts:
        raise ConfigError(f"options {set_opts} only apply to secure aggregation (noise = 'distributed')")
    return PlainDP(plain_codec or Float32Codec())


def _check_sampling(name: str, sampling: str, privacy: Any) -> None:
    """A fixed-size cohort accounted without replacement needs an accountant that can do it."""
    if sampling == "without-replacement" and sampling not in SUPPORTED_SAMPLINGS[privacy.accountant]:
        raise ConfigError(
            f"scheme {name!r}: privacy.accountant = {privacy.accountant!r} cannot account the fixed-size cohort "
            "as sampling without replacement (dp-accounting has no such PLD); use privacy.accountant = 'rdp' "
            "or 'moments', or state privacy.sampling_assumption = 'poisson' (ε then assumes Poisson sampling)")


def client_sampling(name: str, noise: str, sampling: str, n_clients, cohort_size, privacy: Any):
    """How a Gaussian scheme's rounds are accounted: (sampling, (N, |K|) when without replacement else
    None, σ → the round's event for calibration (None: the sampled Gaussian), neighbouring relation)."""
    sampling = "none" if noise == "local" else sampling  # local noise: no amplification by sampling
    _check_sampling(name, sampling, privacy)
    wor = (n_clients, cohort_size) if sampling == "without-replacement" else None
    event = ((lambda x: GaussianEvent(x / 2)) if noise == "local" else
             (lambda x: SampledWithoutReplacementGaussianEvent(x, *wor)) if wor else None)
    return sampling, wor, event, "replace_one" if wor else "add_remove"


def _gaussian_scheme(name: str, compress: list[Step], *, auto_clip,
                     n_params, cohort_size, n_clients, sampling, sampling_rate, rounds, privacy, sigma, epsilon,
                     clip, tolerate, noise, secure_aggregation, neighbours, threshold, drop_after_masking,
                     frac_bits, clip_clients, clip_epsilon) -> Scheme:
    _sigma_or_epsilon(name, sigma, epsilon)
    check_placement(noise)
    tolerate = check_tolerate(tolerate)
    if tolerate and tolerate >= cohort_size:
        raise ConfigError(f"scheme {name!r}: tolerate = {tolerate} must be < the cohort size |K| = {cohort_size}")
    # local noise: worst case, a client in every round, no amplification
    sampling, wor, event, neighbouring = client_sampling(name, noise, sampling, n_clients, cohort_size, privacy)
    if wor and n_clients is None:
        raise ConfigError(f"scheme {name!r}: sampling without replacement needs n_clients (N)")
    clip_step, prefix = _clip_step(name, clip, compress, auto_clip, clip_clients, clip_epsilon, neighbouring)
    if sigma is None:
        sigma = calibrated_sigma(epsilon, privacy, sampling_rate, rounds, event, prefix, neighbouring)
    noise_step = GaussianNoise(sigma, clip_step, sampling_rate, tolerate, noise, without_replacement=wor)
    transport = _transport(noise_step, noise, secure_aggregation, neighbours, threshold, drop_after_masking,
                           frac_bits)
    return Scheme(name, [*compress, clip_step, noise_step], transport, DPMeanAggregator(), privacy_sampling=sampling)


def _median_auto(compress: list[Step], clip_clients):
    return lambda ctx: sensitivity.client_median(ctx, compress, clip_clients)


# ---- the schemes ----------------------------------------------------------------------------------


@register("fl-std-dp")
def fl_std_dp(n_params, cohort_size, sampling_rate, rounds, privacy, sigma: float | None = None,
              epsilon: float | None = None, clip: float | str = "auto", tolerate: int = 0,
              noise: str = "distributed", secure_aggregation: bool | None = None, neighbours: int | None = None,
              threshold: int | None = None, drop_after_masking: float = 0.0, frac_bits: int | None = None,
              clip_clients: int | None = None, clip_epsilon: float = 0.1,
              n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    compress: list[Step] = []
    return _gaussian_scheme("fl-std-dp", compress, auto_clip=_median_auto(compress, clip_clients),
                            **_common(locals()))


@register("fl-cs-dp")
def fl_cs_dp(n_params, cohort_size, sampling_rate, rounds, privacy, ratio: float = 0.05, chunks: int = 200,
             lam: float | str = 1e-5, server_lr: float = 0.35, momentum: float = 0.9, max_iter: int = 1000,
             tol: float = 3e-3, sigma: float | None = None, epsilon: float | None = None,
             clip: float | str = "auto", tolerate: int = 0, noise: str = "distributed",
             secure_aggregation: bool | None = None, neighbours: int | None = None, threshold: int | None = None,
             drop_after_masking: float = 0.0, frac_bits: int | None = None, clip_clients: int | None = None,
             clip_epsilon: float = 0.1, lam_scale: float = 1.0,
             n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    cs = CompressiveSensingStep(ratio, chunks, lam, server_lr, momentum, max_iter, tol, lam_scale)
    scheme = _gaussian_scheme("fl-cs-dp", [cs], auto_clip=_median_auto([cs], clip_clients), **_common(locals()))
    cs.noise_std = scheme.steps[-1].mean_noise_std  # for lam = "noise"
    return scheme


@register("fl-rnd-dp")
def fl_rnd_dp(n_params, cohort_size, sampling_rate, rounds, privacy, ratio: float = 0.05,
              sigma: float | None = None, epsilon: float | None = None, clip: float | str = "auto",
              tolerate: int = 0, noise: str = "distributed", secure_aggregation: bool | None = None,
              neighbours: int | None = None, threshold: int | None = None, drop_after_masking: float = 0.0,
              frac_bits: int | None = None, clip_clients: int | None = None, clip_epsilon: float = 0.1,
              n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    compress: list[Step] = [RandomSubsetStep(ratio)]
    return _gaussian_scheme("fl-rnd-dp", compress, auto_clip=_median_auto(compress, clip_clients),
                            **_common(locals()))


@register("fl-freq-dp")
def fl_freq_dp(n_params, cohort_size, sampling_rate, rounds, privacy, ratio: float = 0.05,
               sigma: float | None = None, epsilon: float | None = None, clip: float | str = "auto",
               tolerate: int = 0, noise: str = "distributed", secure_aggregation: bool | None = None,
               neighbours: int | None = None, threshold: int | None = None, drop_after_masking: float = 0.0,
               frac_bits: int | None = None, clip_clients: int | None = None, clip_epsilon: float = 0.1,
               n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    compress: list[Step] = [LowPassDCTStep(ratio)]
    return _gaussian_scheme("fl-freq-dp", compress, auto_clip=_median_auto(compress, clip_clients),
                            **_common(locals()))


@register("fl-top-dp")
def fl_top_dp(n_params, cohort_size, sampling_rate, rounds, privacy, ratio: float = 0.005, init_steps: int = 5,
              init_lr: float = 0.215, task: str = "multiclass", sigma: float | None = None,
              epsilon: float | None = None, clip: float | str = "auto", tolerate: int = 0,
              noise: str = "distributed", secure_aggregation: bool | None = None, neighbours: int | None = None,
              threshold: int | None = None, drop_after_masking: float = 0.0, frac_bits: int | None = None,
              clip_clients: int | None = None, clip_epsilon: float = 0.1,
              n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    top = TopKStep(ratio, init_steps, init_lr, task)
    return _gaussian_scheme("fl-top-dp", [top],
                            auto_clip=lambda ctx: sensitivity.public_topk(ctx, top.indices), **_common(locals()))


@register("fl-basic-dp")
def fl_basic_dp(n_params, cohort_size, sampling_rate, rounds, privacy, ratio: float = 0.005,
                clip_repeats: int = 100, sigma: float | None = None, epsilon: float | None = None,
                clip: float | str = "auto", tolerate: int = 0, noise: str = "distributed",
                secure_aggregation: bool | None = None, neighbours: int | None = None, threshold: int | None = None,
                drop_after_masking: float = 0.0, frac_bits: int | None = None, clip_clients: int | None = None,
                clip_epsilon: float = 0.1,
                n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    sub = RandomSubsetStep(ratio, mask_training=True)
    return _gaussian_scheme("fl-basic-dp", [sub],
                            auto_clip=lambda ctx: sensitivity.public_random(ctx, sub.k, clip_repeats),
                            **_common(locals()))


_COMMON = ("n_params", "cohort_size", "n_clients", "sampling", "sampling_rate", "rounds", "privacy", "sigma", "epsilon", "clip", "tolerate",
           "noise", "secure_aggregation", "neighbours", "threshold", "drop_after_masking", "frac_bits",
           "clip_clients", "clip_epsilon")


def _common(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in _COMMON}


@register("fl-sign-dp")
def fl_sign_dp(n_params, cohort_size, sampling_rate, rounds, privacy, gamma: float = 0.005,
               sigma: float | None = None, epsilon: float | None = None, tolerate: int = 0,
               noise: str = "distributed", secure_aggregation: bool | None = None, neighbours: int | None = None,
               threshold: int | None = None, drop_after_masking: float = 0.0,
               n_clients: int | None = None, sampling: str = "poisson") -> Scheme:
    _sigma_or_epsilon("fl-sign-dp", sigma, epsilon)
    check_placement(noise)
    tolerate = check_tolerate(tolerate)
    if tolerate and tolerate >= cohort_size:
        raise ConfigError(f"scheme 'fl-sign-dp': tolerate = {tolerate} must be < the cohort size |K| = {cohort_size}")
    if privacy.accountant == "pld":
        raise ConfigError("FL-SIGN-DP's discrete Gaussian event (thesis Thm 3) bounds log-moments: use "
                          "privacy.accountant = 'rdp' or 'moments', not 'pld'")
    sampling = "none" if noise == "local" else sampling  # local noise: no amplification by sampling
    if sampling == "without-replacement":
        raise ConfigError("FL-SIGN-DP's discrete Gaussian bound (thesis Thm 3) is for Poisson sampling; this run "
                          "draws a fixed-size cohort: state privacy.sampling_assumption = 'poisson' (the thesis's "
                          "assumption) or use federation.sampling = 'poisson'")
    if sigma is None:
        probe = DiscreteGaussianShare(1.0, sampling_rate, tolerate, noise)
        k = cohort_size

        def event(x: float) -> Event:
            probe.sigma = x
            if noise == "local":
                return DiscreteGaussianEvent(x / 2, 1.0, n_params, 1,
                                             sampler_tv=n_params * sampler_tv_bound(probe.share_std(n_params, k)))
            return probe.event(n_params, k)

        sigma = calibrated_sigma(epsilon, privacy, sampling_rate, rounds, event)
    sign, share = SignStep(gamma), DiscreteGaussianShare(sigma, sampling_rate, tolerate, noise)
    codec = Float32Codec() if noise == "local" else SignCodec()  # local: noisy integers; central: plain signs
    transport = _transport(share, noise, secure_aggregation, neighbours, threshold, drop_after_masking, None, codec)
    return Scheme("fl-sign-dp", [sign, share], transport, SumAggregator(), privacy_sampling=sampling)
