"""The thesis's bandwidth cost formulas (reference §7), reported beside the measured bytes.

Every table gives the *average* traffic of one federation client up to the best round:
values per message × bits per value × rounds × C (the fraction of clients that take part),
with K = ⌊r·n⌋ values for the compressed schemes. Units: 1 Mbit = 10⁶ bits (Tables 4.2, 4.3),
1 MB = 10⁶ bytes (Table 4.1), 1 KB = 10³ bytes (Tables 4.4, 4.5 and the appendix).
"""

from __future__ import annotations

from dpfl.compression.subset import count_for_ratio
from dpfl.errors import ConfigError

UNIT_BITS = {"bit": 1, "B": 8, "KB": 8e3, "Mbit": 1e6, "MB": 8e6}


def human_bytes(b: float | None) -> str:
    """1000-based units, as the thesis counts (KB = 1,000 B)."""
    if b is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(b) < 1000 or unit == "GB":
            return f"{b:,.0f} {unit}" if unit == "B" else f"{b:,.2f} {unit}"
        b /= 1000
    raise AssertionError


# scheme -> (downstream values, upstream values); "n" = full model, "K" = ⌊r·n⌋
_SHAPES = {
    "fl-std": ("n", "n"),
    "fl-sign": ("n", "n"),
    "signsgd": ("n", "n"),
    "fl-cs": ("n", "K"),
    "fl-rnd": ("n", "K"),
    "fl-freq": ("n", "K"),
    "fl-basic": ("n", "K"),
    "fl-top": ("K", "K"),
}
# bits per value (downstream, upstream) unless `up_bits` overrides the upstream
_BITS = {"fl-sign": (32, 1), "signsgd": (1, 1)}


def message_bits(scheme: str, n: int, r: float = 1.0, up_bits: int | None = None) -> tuple[int, int]:
    """(downstream, upstream) bits of one client's message in one round, by the thesis formula.

    `up_bits` replaces the upstream bits per value (e.g. 21 or 22 for FL-SIGN-DP's sums).
    """
    key = scheme.lower().removesuffix("-dp")
    if key not in _SHAPES:
        raise ConfigError(f"no cost formula for scheme {scheme!r}; allowed: {', '.join(_SHAPES)} (and -dp forms)")
    k = count_for_ratio(r, n)
    down_v, up_v = (n if s == "n" else k for s in _SHAPES[key])
    down_b, up_b = _BITS.get(key, (32, 32))
    if up_bits is not None:
        if not 1 <= up_bits <= 64:
            raise ConfigError(f"up_bits must be in [1, 64], got {up_bits}")
        up_b = up_bits
    return down_v * down_b, up_v * up_b


def average_cost(bits_per_round: float, rounds: int, c: float, unit: str) -> float:
    """Average traffic of one federation client after `rounds` rounds at participation C, in `unit`."""
    if unit not in UNIT_BITS:
        raise ConfigError(f"unknown unit {unit!r}; allowed: {', '.join(UNIT_BITS)}")
    if rounds < 0:
        raise ConfigError(f"rounds must be ≥ 0, got {rounds}")
    if not 0 < c <= 1:
        raise ConfigError(f"participation C must be in (0, 1], got {c}")
    return bits_per_round * rounds * c / UNIT_BITS[unit]


def thesis_costs(scheme: str, n: int, rounds: int, c: float, unit: str, r: float = 1.0,
                 up_bits: int | None = None) -> tuple[float, float]:
    """(downstream, upstream) average cost of `scheme` after `rounds` rounds, in `unit`."""
    down, up = message_bits(scheme, n, r, up_bits)
    return average_cost(down, rounds, c, unit), average_cost(up, rounds, c, unit)
