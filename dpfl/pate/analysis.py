"""PATE privacy analysis: one entry point for LNMax and GNMax.

Inputs are unambiguous: `counts` is the raw vote histogram [examples, classes] (build it from a
teacher-predictions matrix [teachers, examples] with `vote_counts`), `indices` are the *rows*
the student queried (not labels), `labels` the noisy labels that were released for them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from dpfl.errors import DataError, PrivacyError
from dpfl.pate import gnmax, lnmax
from dpfl.pate.noise import laplace
from dpfl.pate.votes import MECHANISMS, noise_per_query
from dpfl.rng import CryptoRNG


@dataclass
class PateReport:
    mechanism: str
    queries: int
    teachers: int
    classes: int
    delta: float
    eps_data_independent: float
    order_data_independent: float
    eps_data_dependent: float  # depends on the raw votes: do not publish as is
    order_data_dependent: float
    smooth_sensitivity: float | None = None  # β-smooth bound on the sensitivity of eps_data_dependent
    eps_data_dependent_released: float | None = (
        None  # eps_data_dependent + Lap(ss_scale · smooth_sensitivity)
    )
    release_epsilon: float | None = None  # the release itself is (release_epsilon, delta)-DP
    beta: float | None = None
    label_agreement: float | None = None  # released labels equal to the plurality vote
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_inputs(counts, indices, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise DataError(f"counts must be a [examples, classes>=2] vote histogram, got shape {counts.shape}")
    if np.any(counts < 0) or not np.all(np.equal(np.mod(counts, 1), 0)):
        raise DataError("counts must be non-negative integer vote counts")
    totals = counts.sum(axis=1)
    if len(counts) and np.any(totals != totals[0]):
        raise DataError(f"every example needs the same number of votes, got {totals.min()}..{totals.max()}")
    idx = np.arange(len(counts)) if indices is None else np.asarray(indices)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise DataError(
            f"indices must be a 1-D array of integer row numbers, got {idx.dtype} shape {idx.shape}"
        )
    if len(idx) == 0:
        raise DataError("no queries: indices is empty")
    if idx.min() < 0 or idx.max() >= len(counts):
        raise DataError(f"indices must be rows in [0, {len(counts) - 1}], got {idx.min()}..{idx.max()}")
    lab = None
    if labels is not None:
        lab = np.asarray(labels)
        if lab.shape != idx.shape:
            raise DataError(
                f"labels must have one entry per queried index ({len(idx)}), got shape {lab.shape}"
            )
        if lab.min() < 0 or lab.max() >= counts.shape[1]:
            raise DataError(f"labels must be class ids in [0, {counts.shape[1] - 1}]")
    return counts.astype(np.float64), idx, lab


def analyze(
    counts: np.ndarray,
    *,
    indices: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    mechanism: str = "lnmax",
    noise: float | np.ndarray = 0.05,
    delta: float = 1e-5,
    moments: int = 8,
    beta: float = 0.09,
    orders: np.ndarray | None = None,
    rng: CryptoRNG | None = None,
) -> PateReport:
    """Data-independent and data-dependent (ε, δ) of answering `indices` by noisy max.

    lnmax: `noise` is γ (Laplace scale 1/γ, (2γ, 0)-DP per query), moments l = 1..`moments`;
    the data-dependent ε is released with β-smooth sensitivity when `rng` is given.
    gnmax: `noise` is σ, RDP at `orders` (default `gnmax.default_orders()`).
    `noise` may be one value per query (heterogeneous noise).
    """
    if mechanism not in MECHANISMS:
        raise PrivacyError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    if not 0 < delta < 1:
        raise PrivacyError(f"δ must lie in (0, 1), got {delta}")
    c, idx, lab = _check_inputs(counts, indices, labels)
    q_counts = c[idx]
    teachers = int(c[0].sum())
    warnings: list[str] = []
    agreement = None if lab is None else float(np.mean(lab == q_counts.argmax(axis=1)))

    if mechanism == "lnmax":
        if not isinstance(moments, int) or moments < 1:
            raise PrivacyError(f"moments must be an integer >= 1, got {moments}")
        gamma = noise_per_query(noise, len(idx), "LNMax γ")
        ls = np.arange(1, moments + 1, dtype=np.float64)
        di = lnmax.data_independent_log_moment(gamma, ls).sum(axis=0)
        dd = lnmax.log_moment_from_counts(q_counts, gamma, ls).sum(axis=0)
        eps_di, i_di = lnmax.epsilon_from_log_moments(di, ls, delta)
        eps_dd, i_dd = lnmax.epsilon_from_log_moments(dd, ls, delta)
        for name, i in (("data-independent", i_di), ("data-dependent", i_dd)):
            if i == moments - 1:
                warnings.append(f"{name} ε is minimised at the largest moment l={moments}: try more moments")
        # ε_l = (α(l) + ln 1/δ)/l, so SS(ε_l) = SS(α(l))/l; min over l has SS <= max_l SS(ε_l).
        ss = float((lnmax.smooth_sensitivity(q_counts, gamma, ls, beta).sum(axis=0) / ls).max())
        release_eps, scale = lnmax.smooth_release_parameters(beta, delta)
        released = None
        if rng is not None:
            released = eps_dd + float(laplace(rng, 1, 1.0)[0]) * scale * ss if ss > 0 else eps_dd
            released = min(released, eps_di)  # post-processing with a data-independent bound
        return PateReport(
            mechanism,
            len(idx),
            teachers,
            c.shape[1],
            delta,
            eps_di,
            float(ls[i_di]),
            eps_dd,
            float(ls[i_dd]),
            ss,
            released,
            release_eps,
            beta,
            agreement,
            warnings,
        )

    sigma = noise_per_query(noise, len(idx), "GNMax σ")
    orders = gnmax.default_orders() if orders is None else np.asarray(orders, dtype=np.float64)
    di = gnmax.rdp_data_independent(sigma, orders).sum(axis=0)
    dd = gnmax.rdp_data_dependent(gnmax.log_q_bound(q_counts, sigma), sigma, orders).sum(axis=0)
    eps_di, o_di = gnmax.epsilon_from_rdp(di, orders, delta)
    eps_dd, o_dd = gnmax.epsilon_from_rdp(dd, orders, delta)
    for name, o in (("data-independent", o_di), ("data-dependent", o_dd)):
        if o == orders.max():
            warnings.append(f"{name} ε is minimised at the largest order {o}: extend the orders")
    warnings.append("GNMax data-dependent ε has no private release here (smooth sensitivity is LNMax only)")
    return PateReport(
        mechanism,
        len(idx),
        teachers,
        c.shape[1],
        delta,
        eps_di,
        o_di,
        eps_dd,
        o_dd,
        label_agreement=agreement,
        warnings=warnings,
    )
