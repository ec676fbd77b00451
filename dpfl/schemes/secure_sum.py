"""`SecAggTransport`: the cohort's rows reach the server only as a secure sum over Z_(2^b)."""

from __future__ import annotations

import numpy as np
import torch

from dpfl.errors import ConfigError
from dpfl.schemes.base import Received, RoundContext, Transport
from dpfl.secagg import ring
from dpfl.secagg.simulate import secure_sum


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
    tolerates none. drop_after_masking: fraction of the cohort (⌊fraction·k⌋ clients, drawn from
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
        ctx.metrics["secagg_bits"] = float(bits)
        ctx.metrics["secagg_dropped"] = float(n_drop)
        ctx.metrics["secagg_protocol_bytes"] = float(stats["protocol_bytes"].mean())
        ctx.metrics["secagg_seconds"] = float(sum(v for key, v in stats.items() if key.endswith("_s")))
        return Received(
            rows=None, total=out, count=len(stats["survivors"]), upstream_bytes=stats["masked_input_bytes"]
        )
