"""Secure sum: `SecAggTransport` (the cohort's rows reach the server only as a sum over Z_(2^b)) and
`SecureSum`, the DP schemes' transport that sizes one per round from the noise step."""

from __future__ import annotations

import math

import numpy as np
import torch

from dpfl.errors import ConfigError
from dpfl.schemes.base import Received, RoundContext, Transport
from dpfl.schemes.dp import DiscreteGaussianShareStep, GaussianNoiseStep, shares
from dpfl.schemes.transport import report_bits
from dpfl.secagg import RoundAborted, gaussian_clip_range, ring, sign_dp_bits
from dpfl.secagg.simulate import check_round_tolerance, secure_sum


class SecAggTransport(Transport):
    """Encode each row in Z_(2^b), run the secure-aggregation protocol, hand the server the sum.

    encoding="fixed": real rows, |value| ≤ clip_range, scale 2^frac_bits with stochastic rounding
    (see `ring`); b is the smallest modulus for which the cohort's sum cannot overflow (or `bits`,
    if given and large enough). Use `ring.gaussian_clip_range` to size clip_range for noisy rows.
    encoding="int": integer rows (discrete Gaussian shares); `bits` is required, e.g.
    `ring.sign_dp_bits(n, sigma, cohort)`, and each |value| must be ≤ (2^(b-1) − 1)/k. Integer
    rows of the word's width (int32 for b ≤ 32), like float32 rows in fixed point, are encoded and
    masked in their own memory, as each client masks its own buffer: `transmit` consumes them.

    max_dropouts (l): how many clients the noise calibration tolerates; a round with more drops
    aborts (`RoundAborted`) instead of releasing a sum with fewer noise shares. The default 0
    tolerates none. The protocol must survive any l lost clients (`graph.max_tolerated`: l ≤
    degree + 1 − t): a round of k clients where it cannot raises one ConfigError line, and so
    does the constructor when `cohort` (the cohort size |K|, if known) is given.
    drop_after_masking: fraction of the cohort (⌊fraction·k⌋ clients, drawn from
    ctx.numpy_rng("secagg-drop")) that shares keys but never delivers its masked input.
    neighbours: None (complete graph) or an even k for the SecAgg+ sparse graph; threshold: Shamir t.

    `upstream_bytes` are the masked-input messages (header + b bits per value, packed); the key,
    share and unmasking messages go to ctx.metrics["secagg_protocol_bytes"] (mean per client).
    Keys and seeds come from the run's seed so simulations are reproducible.
    """

    name = "secagg"
    secure = True

    def __init__(
        self,
        encoding: str = "fixed",
        *,
        clip_range: float | None = None,
        frac_bits: int = 16,
        bits: int | None = None,
        neighbours: int | None = None,
        threshold: int | None = None,
        max_dropouts: int = 0,
        drop_after_masking: float = 0.0,
        cohort: int | None = None,
    ):
        if encoding not in ("fixed", "int"):
            raise ConfigError(f"encoding must be 'fixed' or 'int', got {encoding!r}")
        if encoding == "fixed":
            if clip_range is None:
                raise ConfigError(
                    "fixed-point secure aggregation needs clip_range (max |value| per coordinate)"
                )
            ring.fixed_point_bound(clip_range, frac_bits)  # validates both
        elif bits is None:
            raise ConfigError(
                "integer secure aggregation needs bits (e.g. dpfl.secagg.ring.sign_dp_bits(...))"
            )
        if bits is not None:
            ring.check_bits(bits)
        if not isinstance(max_dropouts, (int, np.integer)) or max_dropouts < 0:
            raise ConfigError(f"max_dropouts must be an integer ≥ 0, got {max_dropouts!r}")
        if not 0.0 <= drop_after_masking < 1.0:
            raise ConfigError(f"drop_after_masking must be a fraction in [0, 1), got {drop_after_masking}")
        self.encoding, self.clip_range, self.frac_bits, self.bits = encoding, clip_range, int(frac_bits), bits
        self.neighbours, self.threshold = neighbours, threshold
        self.max_dropouts, self.drop_after_masking = int(max_dropouts), float(drop_after_masking)
        if cohort is not None:
            self.check_cohort(cohort)

    def check_cohort(self, k: int) -> None:
        """ConfigError (one line) unless a round of k clients survives max_dropouts lost clients."""
        check_round_tolerance(k, self.max_dropouts, self.neighbours, self.threshold)

    def round_check(self, k: int) -> None:
        """The same check for one round's cohort (a sampled cohort may be smaller than |K|): the
        round aborts, releasing nothing, rather than run a sum that could not survive l losses."""
        try:
            self.check_cohort(k)
        except ConfigError as e:
            raise RoundAborted(f"round of {k} clients: {e}") from None

    def round_bits(self, k: int) -> int:
        """The modulus exponent b for a cohort of k clients."""
        if self.encoding == "int":
            return int(self.bits)
        need = ring.fixed_point_bits(self.clip_range, self.frac_bits, k)
        if self.bits is not None and self.bits < need:
            raise ConfigError(
                f"bits = {self.bits} can overflow for {k} clients at this clip range; need ≥ {need}"
            )
        return need if self.bits is None else int(self.bits)

    def transmit(self, u: torch.Tensor, ctx: RoundContext) -> Received:
        if u.ndim != 2 or u.shape[0] < 2:
            raise ConfigError(
                f"secure aggregation needs a cohort of ≥ 2 rows [k, d], got shape {tuple(u.shape)}"
            )
        k = int(u.shape[0])
        self.round_check(k)
        bits = self.round_bits(k)
        if self.encoding == "fixed":
            words = ring.encode_fixed(u, bits, self.clip_range, self.frac_bits, ctx.numpy_rng("secagg-round"),
                                      inplace=True)  # the round's own rows, not used after this
        else:
            x = u.detach().to("cpu").numpy()  # signed rows: encoded (checked) and masked in their own memory
            words = x if x.dtype.kind == "i" else ring.encode_int(u, bits)
        n_drop = int(self.drop_after_masking * k)
        drops = ctx.numpy_rng("secagg-drop").choice(k, size=n_drop, replace=False) if n_drop else ()
        total, stats = secure_sum(
            words,
            bits,
            drop_after_masking=drops,
            threshold=self.threshold,
            neighbours=self.neighbours,
            min_survivors=max(1, k - self.max_dropouts),
            rng_seed=ctx.seeds.seed("round", ctx.round, "secagg"),
            round_id=ctx.round,
            overwrite=True,  # `words` is this round's own encoding
        )
        if self.encoding == "fixed":
            out = torch.from_numpy(ring.decode_fixed(total, bits, self.frac_bits))
        else:
            out = torch.from_numpy(ring.centred_lift(total, bits))
        out = out.to(ctx.device)  # the protocol runs on the CPU; the round goes on on the run's device
        self.bits_per_value = bits  # the round's width on the wire (the round's cost formula reads it)
        ctx.metrics["secagg_bits"] = float(bits)
        ctx.metrics["secagg_dropped"] = float(n_drop)
        ctx.metrics["secagg_protocol_bytes"] = float(stats["protocol_bytes"].mean())
        ctx.metrics["secagg_seconds"] = float(sum(v for key, v in stats.items() if key.endswith("_s")))
        return Received(
            rows=None, total=out, count=len(stats["survivors"]), upstream_bytes=stats["masked_input_bytes"]
        )


class SecureSum(Transport):
    """Distributed noise: the cohort's noisy rows reach the server only as a secure sum over
    Z_(2^b) (`dpfl.secagg.SecAggTransport`, one per round, so b follows the round's k).

    Gaussian rows: fixed point, range S + t·(share std) (exceeded with prob ≤ 2⁻⁴⁰), scale 2^f
    with f = `frac_bits` or, by default, the smallest f whose step is ≤ share std / 256. With adaptive
    clipping each row ends with the clip count's value b − ½ plus its noise share, inside the same sum:
    the range covers ½ + t·(its share std) too, and the step the smaller of the two stds.
    FL-SIGN-DP rows: integers, b = ⌈log₂((12·√n·σ' + 1)·k)⌉ with σ' = σ·√(k/(k − l)) — the
    thesis formula (§5.2.4), which it equals for l = 0, k = |K|.
    `max_dropouts` = l: a round where more than l clients drop after masking aborts; a round of k
    clients whose protocol cannot survive l lost clients raises ConfigError (`SecAggTransport`), and
    so does the constructor for `cohort` = |K| when the cohort size is known at build time.
    """

    name = "secure_sum"
    secure = True

    def __init__(self, noise: GaussianNoiseStep | DiscreteGaussianShareStep, *, neighbours: int | None = None,
                 threshold: int | None = None, drop_after_masking: float = 0.0, frac_bits: int | None = None,
                 cohort: int | None = None):
        self.noise = noise
        self.neighbours, self.threshold = neighbours, threshold
        self.drop_after_masking = float(drop_after_masking)
        if frac_bits is not None and (isinstance(frac_bits, bool) or not isinstance(frac_bits, int)
                                      or not 0 <= frac_bits <= 52):
            raise ConfigError(f"frac_bits must be an integer in [0, 52] or omitted (automatic), got {frac_bits!r}")
        self.frac_bits = frac_bits
        self.bits_per_value: int | None = None
        # validates neighbours / threshold / drop fraction once, and l against |K| when known
        self._inner(encoding="int", bits=8, cohort=cohort)

    def _inner(self, **kw) -> SecAggTransport:
        return SecAggTransport(neighbours=self.neighbours, threshold=self.threshold,
                               max_dropouts=self.noise.tolerate, drop_after_masking=self.drop_after_masking, **kw)

    def round_transport(self, k: int, d: int) -> SecAggTransport:
        """The secure-aggregation transport for a round of k clients with d values each."""
        try:
            check_round_tolerance(k, self.noise.tolerate, self.neighbours, self.threshold)
        except ConfigError as e:
            raise RoundAborted(f"round of {k} clients: {e}") from None
        if isinstance(self.noise, DiscreteGaussianShareStep):
            m = shares(k, self.noise.tolerate)
            return self._inner(encoding="int", bits=sign_dp_bits(d, self.noise.sigma * math.sqrt(k / m), k))
        std = finest = self.noise.share_std(k)
        rng = gaussian_clip_range(self.noise.clip.bound, std, k * d)
        if self.noise.count_sigma is not None:  # adaptive clipping: the row's last value is b − ½ + its share
            count_std = self.noise.count_share_std(k)
            rng, finest = max(rng, gaussian_clip_range(0.5, count_std, k * d)), min(std, count_std)
        f = self.frac_bits if self.frac_bits is not None else min(52, max(0, math.ceil(8 - math.log2(finest))))
        return self._inner(encoding="fixed", clip_range=rng, frac_bits=f)

    def transmit(self, u: torch.Tensor, ctx: RoundContext) -> Received:
        k, d = u.shape
        if k < 2:
            raise RoundAborted(f"secure aggregation needs ≥ 2 clients, round {ctx.round} has {k}: nothing released")
        inner = self.round_transport(k, d)
        self.bits_per_value = inner.round_bits(k)
        rec = inner.transmit(u, ctx)
        report_bits(rec, d, ctx)
        ctx.metrics["secagg_survivors"] = rec.count
        return rec

    def describe(self) -> str:
        nb = "complete graph" if self.neighbours is None else f"{self.neighbours} neighbours"
        return f"secure_sum({nb}, l={self.noise.tolerate})"
