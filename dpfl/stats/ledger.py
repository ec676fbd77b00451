"""The link from `dpfl.classic` / `dpfl.stats` to the privacy ledger.

These modules use replace-one neighbours and state sensitivities as the largest change of the
released value when one record is replaced (Δ). `dpfl.privacy` events take noise relative to
the contribution bound C of one record, with Δ = 2C under ``replace_one``; hence the /2 below.
Ledgers default to the RDP accountant: fast for any ε, and for pure-DP steps
``ledger.epsilon(delta)`` (delta > 0) is within ln(1/delta)/1023 of the sum of their ε's (the PLD
accountant is tighter but needs ~ε/1e-4 buckets per Laplace step: minutes for ε >= 100).
"""

from __future__ import annotations

from dpfl.errors import PrivacyError
from dpfl.privacy.events import GaussianEvent, LaplaceEvent, PureDPEvent, flatten
from dpfl.privacy.ledger import Ledger

NEIGHBOURING = "replace_one"


def make_ledger(ledger=None) -> Ledger:
    """The caller's ledger (one budget over several releases), or a fresh replace-one RDP ledger."""
    if ledger is None:
        return Ledger(accountant="rdp", neighbouring=NEIGHBOURING)
    if not isinstance(ledger, Ledger):
        raise PrivacyError(f"ledger must be a dpfl.privacy.ledger.Ledger, got {type(ledger).__name__}")
    if ledger.neighbouring != NEIGHBOURING:
        raise PrivacyError(
            f"these estimators are private under {NEIGHBOURING!r} neighbours; the ledger uses "
            f"{ledger.neighbouring!r}: create it with Ledger(..., neighbouring={NEIGHBOURING!r})"
        )
    return ledger


def laplace_event(noise_scale: float, sensitivity: float) -> LaplaceEvent:
    """Laplace noise of `noise_scale` on a value with replace-one L1 sensitivity Δ: ε = Δ / scale."""
    return LaplaceEvent(scale=noise_scale / (sensitivity / 2.0))


def gaussian_event(sigma: float, sensitivity: float) -> GaussianEvent:
    """Gaussian noise of std `sigma` on a value with replace-one L2 sensitivity Δ."""
    return GaussianEvent(noise_multiplier=sigma / (sensitivity / 2.0))


def pure_event(epsilon: float) -> PureDPEvent:
    """Any ε-DP step under replace-one neighbours (e.g. one exponential-mechanism selection)."""
    return PureDPEvent(epsilon)


def pure_epsilon(ledger: Ledger) -> float | None:
    """Sum of the pure ε of the ledger's events (basic composition), read back from what was
    recorded; None if any event is not pure (Gaussian, (ε, δ), ...)."""
    per_c = 2.0 if ledger.neighbouring == "replace_one" else 1.0  # one record moves a value by 2C or C
    total = 0.0
    for event, count in ledger.events:
        for leaf, k in flatten(event, count):
            if isinstance(leaf, LaplaceEvent):
                total += k * per_c / leaf.scale
            elif isinstance(leaf, PureDPEvent):
                total += k * leaf.epsilon
            else:
                return None
    return total
