"""Any compression scheme → its client-level DP version (thesis ch. 5): `make_private(base, dp)`.

    Gaussian (default)   base steps → ClipStep(S) → GaussianNoiseStep(σ)   | secure sum or plain | DP mean
    post-processing      ClipStep(S) → noise → base steps (local), ClipStep(S) → base steps → noise (central)
    discrete (FL-SIGN)   base steps → DiscreteGaussianShareStep(σ)      | secure sum or plain | sum

σ is resolved once (`resolve_sigma`): the given multiplier, or the smallest one that reaches the
target ε for the events the run will record (`privacy.calibrate_sigma_for_events`).

clip = "adaptive" (Andrew et al. 2021): `AdaptiveClipStep` instead of ClipStep(S); σ is then the joint
query's multiplier (the ledger's event), and the noise step gives the update σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)
and the clip count σ_b (`dp.adaptive_update_sigma`), so a target ε calibrates the joint mechanism.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dpfl.compression.base import Float32Codec
from dpfl.errors import ConfigError
from dpfl.privacy import (
    DiscreteGaussianEvent,
    Event,
    GaussianEvent,
    SampledWithoutReplacementGaussianEvent,
    calibrate_sigma_for_events,
    sampler_tv_bound,
)
from dpfl.schemes import sensitivity
from dpfl.schemes.aggregators import SumAggregator
from dpfl.schemes.base import SetupContext, Step, Transport
from dpfl.schemes.dp import (
    AdaptiveClipStep,
    ClipStep,
    DiscreteGaussianShareStep,
    DPMeanAggregator,
    GaussianNoiseStep,
    correlated_noise,
)
from dpfl.schemes.dp_options import DPOptions
from dpfl.schemes.registry import Scheme
from dpfl.schemes.secure_sum import SecureSum
from dpfl.schemes.transport import PlainDP, PlainTransport

ClipSelector = Callable[[SetupContext], tuple[float, str]]


def make_private(base: Scheme, dp: DPOptions, *, auto_clip: ClipSelector | None = None,
                 post_processing: bool = False, norm_growth: float = 1.0) -> Scheme:
    """The client-level DP version of `base` (a scheme with a plain transport), named `dp.name`.

    auto_clip: how clip = "auto" picks S (default: median norm of the clients' compressed
    updates, `sensitivity.client_median`). post_processing: the base steps run after the noise
    (a quantizer on the wire, e.g. QSGD); with central noise the server's noise then covers
    sensitivity `norm_growth`·S (‖step(v)‖ ≤ norm_growth·‖v‖)."""
    if not isinstance(base.transport, PlainTransport):
        raise ConfigError(f"scheme {dp.name!r}: the DP wrapper needs a base scheme with a plain transport")
    if dp.mechanism == "discrete":
        noise: GaussianNoiseStep | DiscreteGaussianShareStep = _discrete_noise(dp)
        chain = [*base.steps, noise]
    else:
        if post_processing and dp.noise == "distributed":
            raise ConfigError(f"scheme {dp.name!r}: noise must be 'local' or 'central', got 'distributed' (its "
                              "compression runs after the noise: shares would be compressed before they sum, "
                              "with no Gaussian guarantee)")
        compress = [] if post_processing else list(base.steps)
        clip, prefix = _clip_step(dp, compress, auto_clip, post_processing)
        sens = clip
        if post_processing and dp.noise == "central":  # ‖Q(v)‖ ≤ growth·‖v‖ (+ float margin)
            sens = ClipStep(clip.bound * norm_growth * (1 + 1e-6))
        try:
            if dp.correlated is not None:  # DP-FTRL (tree) or BandMF, accounted on the participation schema
                noise = correlated_noise(dp, sens, prefix)
            else:
                sigma = resolve_sigma(dp, _gaussian_event(dp), prefix)  # adaptive clipping: the joint σ, split below
                noise = GaussianNoiseStep(sigma, sens, dp.sampling_rate, dp.tolerate, dp.noise,
                                          without_replacement=dp.without_replacement)
        except ConfigError as e:
            raise ConfigError(f"scheme {dp.name!r}: {e}") from None
        if not post_processing:
            chain = [*compress, clip, noise]
        else:
            chain = [clip, noise, *base.steps] if dp.noise == "local" else [clip, *base.steps, noise]
    if dp.secure:
        transport: Transport = SecureSum(noise, neighbours=dp.neighbours, threshold=dp.threshold,
                                         drop_after_masking=dp.drop_after_masking, frac_bits=dp.frac_bits,
                                         cohort=dp.cohort_size if dp.cohort_size >= 2 else None)
    else:  # the wire keeps the base's codec, except for rows a client noised in full after compressing
        local_rows = dp.noise == "local" and not post_processing
        transport = PlainDP(Float32Codec() if local_rows else base.transport.codec)
    aggregator = SumAggregator() if dp.mechanism == "discrete" else DPMeanAggregator()
    return Scheme(dp.name, chain, transport, aggregator, train_overrides=dict(base.train_overrides),
                  full_batch=base.full_batch, one_pass=base.one_pass, all_clients=base.all_clients,
                  privacy_sampling=dp.accounted_sampling)


def resolve_sigma(dp: DPOptions, event: Callable[[float], Event] | None = None, prefix: Sequence[Event] = ()) -> float:
    """σ: the given noise multiplier, or the smallest that reaches dp.epsilon after `prefix` and
    T rounds of event(σ) (default: the Poisson-sampled Gaussian)."""
    if dp.sigma is not None:
        return dp.sigma
    return calibrate_sigma_for_events(dp.epsilon, dp.delta, dp.sampling_rate, dp.rounds, dp.accountant,
                                      event, tuple(prefix), dp.neighbouring)


def _gaussian_event(dp: DPOptions) -> Callable[[float], Event] | None:
    """σ → one round's event, as GaussianNoiseStep records it (None: the Poisson-sampled Gaussian)."""
    if dp.noise == "local":  # worst case: a client in every round, sensitivity 2S
        return lambda x: GaussianEvent(x / 2)
    wor = dp.without_replacement
    return (lambda x: SampledWithoutReplacementGaussianEvent(x, *wor)) if wor else None


def _discrete_noise(dp: DPOptions) -> DiscreteGaussianShareStep:
    """FL-SIGN-DP's share, σ calibrated on the event its round records for |K| clients."""
    probe = DiscreteGaussianShareStep(1.0, dp.sampling_rate, dp.tolerate, dp.noise)
    n, k = dp.n_params, dp.cohort_size

    def event(x: float) -> Event:
        probe.sigma = x
        if dp.noise == "local":
            return DiscreteGaussianEvent(x / 2, 1.0, n, 1, sampler_tv=n * sampler_tv_bound(probe.share_std(n, k)))
        return probe.event(n, k)

    return DiscreteGaussianShareStep(resolve_sigma(dp, event), dp.sampling_rate, dp.tolerate, dp.noise)


def _clip_step(dp: DPOptions, compress: list[Step], auto: ClipSelector | None,
               post_processing: bool) -> tuple[ClipStep, tuple[Event, ...]]:
    """The ClipStep step for dp.clip, and the events its selection charges."""
    if isinstance(dp.clip, float):
        return ClipStep(dp.clip), ()
    if post_processing:
        raise ConfigError(f"scheme {dp.name!r}: clip must be a number > 0 here (its compression runs after the "
                          f"noise), got {dp.clip!r}")
    if dp.clip == "adaptive":
        return AdaptiveClipStep(dp.adaptive("clip_init"), dp.adaptive("clip_quantile"), dp.adaptive("clip_lr"),
                                dp.adaptive("clip_count_sigma")), ()
    if dp.clip == "auto":
        return ClipStep(selector=auto or (lambda ctx: sensitivity.client_median(ctx, compress, dp.clip_clients))), ()
    eps0 = dp.clip_epsilon
    return (ClipStep(selector=lambda ctx: sensitivity.private_median(ctx, compress, eps0, dp.clip_clients)),
            (sensitivity.private_median_event(eps0, dp.neighbouring),))

