"""Integer encoding over Z_(2^b), decoding of sums, and the choice of b.

Elements of Z_(2^b) are stored as unsigned machine words: uint32 when b ≤ 32, else uint64.
Arithmetic wraps mod 2^32 (or 2^64) and is reduced mod 2^b at the end; this is exact
because 2^b divides 2^32 (2^64).

Signed integers x with |x| < 2^(b-1) are encoded as x mod 2^b (two's complement) and a sum
is decoded by the centred lift: s ↦ s if s < 2^(b-1), else s − 2^b.

No-overflow bound (used by every `*_bits` function below). Let each of k clients send
integers with |x_i| ≤ B and pick the smallest b with k·B ≤ 2^(b-1) − 1. Then every partial or
full sum S of at most k such vectors satisfies |S| ≤ k·B ≤ 2^(b-1) − 1, so S lies in the window
[−2^(b-1) + 1, 2^(b-1) − 1] on which the centred lift is the inverse of reduction mod 2^b:
the decoded sum equals the integer sum exactly. Encoders enforce |x_i| ≤ B and raise
`ProtocolError` otherwise, so overflow cannot happen silently.

Fixed-point vectors use the scale 2^f (f fractional bits, exact in binary floating point) and
*stochastic* rounding: q = ⌊y⌋ + [U < y − ⌊y⌋] with y = x·2^f and U uniform from the caller's
generator. It is unbiased (E[q] = y), so the rounding error of the sum is zero-mean with
variance ≤ k/4 units instead of a bias that could grow to k/2 units per coordinate and repeat
in every round; and the same generator state gives the same words.
"""

from __future__ import annotations

import importlib
import math
import sys
from typing import TYPE_CHECKING

import numpy as np

from dpfl.errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    import torch

try:  # the optional C extension (setup.py): a one-pass min/max for the range checks
    _kernel = importlib.import_module("dpfl.secagg._maskkernel")  # by name: a compiled module, not a .py
except ImportError:
    _kernel = None

MAX_BITS = 64


def _numpy(rows: torch.Tensor | np.ndarray) -> np.ndarray:
    """A tensor's values on the CPU, or the array itself (torch is not imported here: a client
    masking words needs only NumPy, and a tensor exists only where torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(rows, torch.Tensor):
        return rows.detach().to("cpu").numpy()
    return np.asarray(rows)

def int_range(x: np.ndarray) -> tuple[int, int]:
    """(min, max) of a non-empty integer array, in one pass where the C extension is built."""
    if _kernel is not None and x.dtype.kind in "iu" and x.dtype.itemsize in (4, 8) and x.flags.c_contiguous:
        return _kernel.int_range(x, x.dtype.itemsize, x.dtype.kind == "i")
    return int(x.min()), int(x.max())


def check_int_range(x: np.ndarray, bits: int, bound: int) -> None:
    """Raise `ProtocolError` unless every |value| of the integer array x is ≤ bound (one pass)."""
    lo, hi = int_range(x) if x.size else (0, 0)
    if max(-lo, hi) > bound:
        raise ProtocolError(
            f"integer value of magnitude {max(-lo, hi)} outside the allowed range ±{bound} for b = {bits}"
        )


def word_dtype(bits: int) -> np.dtype:
    """Machine word for Z_(2^bits): uint32 for bits ≤ 32, uint64 up to 64."""
    check_bits(bits)
    return np.dtype(np.uint32) if bits <= 32 else np.dtype(np.uint64)


def check_bits(bits: int) -> int:
    if not isinstance(bits, (int, np.integer)) or isinstance(bits, bool) or not 1 <= int(bits) <= MAX_BITS:
        raise ConfigError(f"modulus bits b must be an integer in [1, {MAX_BITS}], got {bits!r}")
    return int(bits)


def bits_for_bound(bound: int, n_clients: int) -> int:
    """Smallest b with n_clients·bound ≤ 2^(b-1) − 1 (see the module docstring for the proof)."""
    if bound < 0 or n_clients < 1:
        raise ConfigError(f"need bound ≥ 0 and n_clients ≥ 1, got bound={bound}, n_clients={n_clients}")
    b = max(1, (int(n_clients) * int(bound)).bit_length() + 1)
    if b > MAX_BITS:
        raise ConfigError(
            f"sum bound {n_clients}·{bound} needs b = {b} bits > {MAX_BITS}; "
            "lower the clip range, the fractional bits or the cohort size"
        )
    return b


def client_bound(bits: int, n_clients: int) -> int:
    """Largest per-client |value| for which a sum of n_clients vectors cannot overflow Z_(2^bits)."""
    check_bits(bits)
    if n_clients < 1:
        raise ConfigError(f"n_clients must be ≥ 1, got {n_clients}")
    return ((1 << (bits - 1)) - 1) // n_clients


def sign_dp_bits(n_params: int, sigma: float, cohort: int, mu_max: float = 1.0) -> int:
    """The thesis modulus for FL-SIGN-DP: b = ⌈log2((12·√n·σ + max‖μ‖∞)·|K|)⌉ (§5.2.4).

    `encode_int` then admits per-client values |z| ≤ ⌊(2^(b-1) − 1)/|K|⌋ ≥ 6·√n·σ − 1
    (|K| ≥ 2). For a share z ~ DG(μ, ξ = √n·σ/√|K|), |μ| ≤ 1, [MW17, Lemma 2] and a union
    bound give P[some of the |K|·n values is out of range] ≤ 3·|K|·n·exp(−(6·√|K| − 2/ξ)²/2),
    below 2^-1000 at |K| = 100; an out-of-range share is rejected (`ProtocolError`), not wrapped.
    """
    if n_params < 1 or cohort < 1 or not sigma > 0 or mu_max < 0:
        raise ConfigError(
            "need n_params ≥ 1, cohort ≥ 1, sigma > 0, mu_max ≥ 0; "
            f"got {n_params}, {cohort}, {sigma}, {mu_max}"
        )
    b = math.ceil(math.log2((12.0 * math.sqrt(n_params) * sigma + mu_max) * cohort))
    if b > MAX_BITS:
        raise ConfigError(f"FL-SIGN-DP modulus needs b = {b} bits > {MAX_BITS}")
    return b


def fixed_point_bound(clip_range: float, frac_bits: int) -> int:
    """Largest |q| a value in [−clip_range, clip_range] can round to at scale 2^frac_bits."""
    if not (math.isfinite(clip_range) and clip_range > 0):
        raise ConfigError(f"clip_range must be a positive finite number, got {clip_range}")
    if not isinstance(frac_bits, (int, np.integer)) or not 0 <= frac_bits <= 52:
        raise ConfigError(f"frac_bits must be an integer in [0, 52], got {frac_bits!r}")
    # x·2^f is exact, so stochastic rounding never goes beyond ⌈c·2^f⌉
    return math.ceil(math.ldexp(clip_range, int(frac_bits)))


def fixed_point_bits(clip_range: float, frac_bits: int, n_clients: int) -> int:
    """b such that the sum of n_clients fixed-point vectors with |x| ≤ clip_range cannot overflow."""
    return bits_for_bound(fixed_point_bound(clip_range, frac_bits), n_clients)


def gaussian_clip_range(l2_clip: float, noise_std: float, n_values: int, log2_fail: float = 40.0) -> float:
    """A per-coordinate range for clipped-plus-Gaussian-noise values that is left with prob ≤ 2^-log2_fail.

    |x + z| ≤ S + t·s for every one of n_values coordinates (|x| ≤ S after L2 clipping,
    z ~ N(0, s²)) except with probability ≤ n_values·2·exp(−t²/2) (Gaussian tail, union bound),
    so t = √(2·ln(2·n_values·2^log2_fail)).
    """
    if l2_clip < 0 or noise_std < 0 or n_values < 1:
        raise ConfigError(
            f"need l2_clip ≥ 0, noise_std ≥ 0, n_values ≥ 1; got {l2_clip}, {noise_std}, {n_values}"
        )
    t = math.sqrt(2.0 * (math.log(2.0 * n_values) + log2_fail * math.log(2.0)))
    return float(l2_clip + t * noise_std)


_ENCODE_CHUNK = 1 << 14  # values per chunk of `encode_fixed` (its buffers stay in L2)


def encode_fixed(
    rows: torch.Tensor | np.ndarray,
    bits: int,
    clip_range: float,
    frac_bits: int,
    rng: np.random.Generator,
    inplace: bool = False,
) -> np.ndarray:
    """Real rows [k, d] → words in Z_(2^bits) [k, d] (scale 2^frac_bits, stochastic rounding).

    `inplace`: when the rows are C-contiguous floats of the word's width (float32 for b ≤ 32),
    write each row's words over that row once it has been read (the caller's rows are then gone;
    same words): this skips a fresh [k, d] array whose first-touch page faults cost more than the
    encoding. The range is checked first: rejected rows are left as they were."""
    check_bits(bits)
    x = _numpy(rows)
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise ProtocolError(f"fixed-point encoding needs real rows, got dtype {x.dtype}")
    if x.ndim != 2:
        raise ConfigError(f"rows must have shape [k, d], got {x.shape}")
    bound = fixed_point_bound(clip_range, frac_bits)
    if bound > client_bound(bits, max(1, x.shape[0])):
        raise ConfigError(
            f"{bits} bits cannot hold the sum of {x.shape[0]} values in ±{clip_range} at 2^-{frac_bits}; "
            f"need b ≥ {fixed_point_bits(clip_range, frac_bits, x.shape[0])}"
        )
    worst = max(-float(x.min()), float(x.max())) if x.size else 0.0  # NaN/inf propagate to here
    if not math.isfinite(worst):
        raise ProtocolError("fixed-point input contains NaN or infinity")
    if worst > clip_range:
        raise ProtocolError(f"value {worst:.6g} outside the clip range ±{clip_range}; raise clip_range")
    scale = math.ldexp(1.0, int(frac_bits))
    wd = word_dtype(bits)
    mine = inplace and x.dtype.kind == "f" and x.dtype.itemsize == wd.itemsize and x.flags.c_contiguous
    out = x.view(wd) if mine and x.flags.writeable else np.empty(x.shape, dtype=wd)
    d = x.shape[1]
    ch = min(d, _ENCODE_CHUNK) or 1
    y, q, u = (np.empty(ch) for _ in range(3))  # cache-sized buffers, reused for every chunk
    up, q_int = np.empty(ch, dtype=bool), np.empty(ch, dtype=np.int64)
    for i in range(x.shape[0]):  # row by row: bounded memory; row i is read before it is written
        for s in range(0, d, ch):  # in order: the draws are those of rng.random(size=d)
            m = min(ch, d - s)
            ym, qm = y[:m], q[:m]
            ym[:] = x[i, s : s + m]
            ym *= scale  # exact (power of two)
            np.floor(ym, out=qm)
            ym -= qm  # fractional part in [0, 1), exact
            np.less(rng.random(out=u[:m]), ym, out=up[:m])
            qm += up[:m]
            q_int[:m] = qm
            out[i, s : s + m] = q_int[:m]  # assignment wraps mod 2^32 / 2^64 (two's complement)
    return reduce(out, bits)


def encode_int(rows: torch.Tensor | np.ndarray, bits: int, bound: int | None = None) -> np.ndarray:
    """Integer rows [k, d] (e.g. discrete Gaussian shares) → words in Z_(2^bits).

    Every |value| must be ≤ `bound` (default: `client_bound(bits, k)`, the no-overflow limit).
    (`simulate.secure_sum` also takes signed rows and encodes them without a copy.)
    """
    check_bits(bits)
    x = _numpy(rows)
    if x.ndim != 2:
        raise ConfigError(f"rows must have shape [k, d], got {x.shape}")
    if np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all() or not np.array_equal(x, np.rint(x)):
            raise ProtocolError(
                "integer encoding got non-integral values; use fixed-point encoding for reals"
            )
    elif not np.issubdtype(x.dtype, np.integer):
        raise ProtocolError(f"integer encoding needs integer or integral float rows, got dtype {x.dtype}")
    limit = client_bound(bits, max(1, x.shape[0]))
    bound = limit if bound is None else int(bound)
    if bound > limit:
        raise ConfigError(
            f"per-client bound {bound} can overflow {bits} bits with {x.shape[0]} clients (max {limit})"
        )
    check_int_range(x, bits, bound)
    out = np.empty(x.shape, dtype=word_dtype(bits))
    for i in range(x.shape[0]):
        out[i] = (
            x[i] if np.issubdtype(x.dtype, np.integer) else x[i].astype(np.int64)
        )  # wraps: two's complement
    return reduce(out, bits)


def reduce(words: np.ndarray, bits: int) -> np.ndarray:
    """Reduce words mod 2^bits in place and return them."""
    if bits < words.dtype.itemsize * 8:
        words &= words.dtype.type((1 << bits) - 1)
    return words


def centred_lift(words: np.ndarray, bits: int) -> np.ndarray:
    """Words in Z_(2^bits) → int64 in [−2^(bits-1), 2^(bits-1))."""
    check_bits(bits)
    w = np.asarray(words).astype(np.uint64)
    if bits < 64:
        w = w & np.uint64((1 << bits) - 1)
        s = w.astype(np.int64)
        s[s >= (1 << (bits - 1))] -= 1 << bits
        return s
    return w.view(np.int64)


def decode_fixed(words: np.ndarray, bits: int, frac_bits: int) -> np.ndarray:
    """A sum in Z_(2^bits) → float64 (centred lift, then divide by 2^frac_bits)."""
    return np.ldexp(centred_lift(words, bits).astype(np.float64), -int(frac_bits))
