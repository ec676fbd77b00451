"""PATE privacy analysis: one entry point for LNMax and GNMax.

Inputs are unambiguous: `counts` is the raw vote histogram [examples, classes] (build it from a
teacher-predictions matrix [teachers, examples] with `vote_counts`), `indices` are the *rows*
the student queried (not labels), `labels` the noisy labels that were released for them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from dpfl.errors import DataError, PrivacyError
from dpfl.pate import gnmax, gnss, lnmax
from dpfl.pate.noise import gaussian, laplace
from dpfl.pate.votes import MECHANISMS, UNANSWERED, check_threshold, noise_per_query
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
        None  # LNMax: eps_dd + Lap(ss_scale·SS); GNMax: eps_dd at release_order + SS·N(0, ss_sigma²) + release_rdp
    )
    release_epsilon: float | None = None  # the release itself is (release_epsilon, delta)-DP
    beta: float | None = None
    label_agreement: float | None = None  # released labels equal to the plurality vote
    warnings: list[str] = field(default_factory=list)
    # GNMax / Confident-GNMax: GNSS release at one order (Papernot et al. 2018, Theorem 23)
    answered: int | None = None  # queries charged for the GNMax step
    release_order: float | None = None
    release_rdp: float | None = None  # RDP of the release itself at release_order, included in the release
    ss_sigma: float | None = None
    eps_data_dependent_at_order: float | None = None  # raw, at release_order: the value that gets noised

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GaussianOptions:
    """Confident-GNMax's step 1 and the smooth-sensitivity (GNSS) release of GNMax-type analyses.

    threshold/sigma1: step 1 (confident-gnmax only; threshold −inf = always answer);
    threshold_data_independent: charge step 1 α/(2σ1²) even in the data-dependent ε;
    order: Rényi order of the release (default: the data-dependent optimum, which depends on the
    votes); beta: smoothness, default 0.4/order; ss_sigma: σ_s of the release noise S·N(0, σ_s²).
    """

    threshold: float | None = None
    sigma1: float | None = None
    threshold_data_independent: bool = False
    order: float | None = None
    beta: float | None = None
    ss_sigma: float = 5.0


def _check_inputs(
    counts, indices, labels, unanswered: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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
        if lab.min() < (UNANSWERED if unanswered else 0) or lab.max() >= counts.shape[1]:
            extra = f" or {UNANSWERED} (not answered)" if unanswered else ""
            raise DataError(f"labels must be class ids in [0, {counts.shape[1] - 1}]{extra}")
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
    beta: float | None = None,
    orders: np.ndarray | None = None,
    rng: CryptoRNG | None = None,
    gauss: GaussianOptions | None = None,
) -> PateReport:
    """Data-independent and data-dependent (ε, δ) of answering `indices` by noisy max.

    lnmax: `noise` is γ (Laplace scale 1/γ, (2γ, 0)-DP per query), moments l = 1..`moments`;
    the data-dependent ε is released with β-smooth sensitivity when `rng` is given.
    gnmax: `noise` is σ, RDP at `orders` (default `gnmax.default_orders()`);
    confident-gnmax: `noise` is σ2, step 1 in `gauss` (threshold, σ1); `labels` −1 = not answered.
    For both the data-dependent ε at one order is released by GNSS (`gauss`) when `rng` is given;
    `beta` (default 0.09 for lnmax, 0.4/order for GNSS) is the smoothness.
    `noise` may be one value per query (heterogeneous noise).
    """
    if mechanism not in MECHANISMS:
        raise PrivacyError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    if not 0 < delta < 1:
        raise PrivacyError(f"δ must lie in (0, 1), got {delta}")
    c, idx, lab = _check_inputs(counts, indices, labels, mechanism == "confident-gnmax")
    q_counts = c[idx]
    teachers = int(c[0].sum())
    warnings: list[str] = []
    agreement = None
    if lab is not None and np.any(lab != UNANSWERED):
        ans = lab != UNANSWERED
        agreement = float(np.mean(lab[ans] == q_counts[ans].argmax(axis=1)))

    if mechanism == "lnmax":
        if gauss is not None and (gauss.threshold is not None or gauss.sigma1 is not None):
            raise PrivacyError("a threshold and σ1 belong to confident-gnmax, not lnmax")
        if gauss is not None and gauss.order is not None:
            raise PrivacyError("a release order belongs to gnmax and confident-gnmax, not lnmax")
        beta = 0.09 if beta is None else beta
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

    opts = GaussianOptions() if gauss is None else gauss
    if mechanism != "confident-gnmax" and (opts.threshold is not None or opts.sigma1 is not None):
        raise PrivacyError(f"a threshold and σ1 belong to confident-gnmax, not {mechanism}")
    if beta is not None:
        opts = replace(opts, beta=beta)
    return _gaussian_report(
        q_counts, lab, teachers, c.shape[1], mechanism, noise, delta, orders, agreement, opts, rng
    )


def _gaussian_report(q_counts, lab, teachers, classes, mechanism, noise, delta, orders, agreement, opts, rng):
    warnings: list[str] = []
    n_q = len(q_counts)
    sigma = noise_per_query(noise, n_q, "GNMax σ" if mechanism == "gnmax" else "Confident-GNMax σ2")
    orders = gnmax.default_orders() if orders is None else np.asarray(orders, dtype=np.float64)
    confident = mechanism == "confident-gnmax"
    if confident:
        if opts.threshold is None or opts.sigma1 is None:
            raise PrivacyError("confident-gnmax needs a threshold T and σ1")
        check_threshold(opts.threshold, opts.sigma1)
    elif lab is not None and lab.min() < 0:
        raise DataError(f"{mechanism} answers every query: labels must be class ids >= 0")
    if lab is not None:
        answered = lab != UNANSWERED
    else:
        answered = np.ones(n_q, dtype=bool)
        if confident:
            warnings.append("no released labels: step 2 is charged on every query (an upper bound)")
    step2 = answered[:, None]
    di = (gnmax.rdp_data_independent(sigma, orders) * step2).sum(axis=0)
    dd = (gnmax.rdp_data_dependent(gnmax.log_q_bound(q_counts, sigma), sigma, orders) * step2).sum(axis=0)
    always = confident and opts.threshold == -np.inf  # step 1 has a constant output: free
    if confident and not always:
        di1 = gnmax.rdp_threshold_data_independent(opts.sigma1, orders)[0] * n_q
        log_p = gnmax.log_pr_answered(q_counts.max(axis=1), opts.threshold, opts.sigma1)
        dd1 = (
            di1
            if opts.threshold_data_independent
            else gnmax.rdp_threshold(log_p, opts.sigma1, orders).sum(axis=0)
        )
        di, dd = di + di1, dd + dd1
    eps_di, o_di = gnmax.epsilon_from_rdp(di, orders, delta)
    eps_dd, o_dd = gnmax.epsilon_from_rdp(dd, orders, delta)
    for name, o in (("data-independent", o_di), ("data-dependent", o_dd)):
        if o == orders.max():
            warnings.append(f"{name} ε is minimised at the largest order {o}: extend the orders")

    if opts.order is not None and not 1 < opts.order < math.inf:
        raise PrivacyError(f"the release order must be > 1 and finite, got {opts.order}")
    order = o_dd if opts.order is None else float(opts.order)
    if opts.order is None:
        warnings.append(f"release order {order:g} was chosen from the raw votes: fix --order in advance")
    beta = 0.4 / order if opts.beta is None else float(opts.beta)
    release_rdp = gnss.gnss_rdp(beta, opts.ss_sigma, order)
    one = [order]
    f = float(
        (gnmax.rdp_data_dependent(gnmax.log_q_bound(q_counts, sigma), sigma, one)[:, 0] * answered).sum()
    )
    u = np.zeros(teachers + 1)  # Σ_queries U_r, r = 0..teachers
    per = max(1, 1_000_000 // ((teachers + 1) * classes))  # queries per chunk: bounded memory
    try:
        for i in range(0, n_q, per):
            ls = gnss.gnmax_ls_bounds(q_counts[i : i + per], sigma[i : i + per], order)
            u += (ls * answered[i : i + per]).sum(axis=1)
    except gnss.NotMonotoneError as e:
        warnings.append(f"no smooth-sensitivity release: {e}")
        rng, u = None, None
    if confident and not always:
        if opts.threshold_data_independent:
            f += float(gnmax.rdp_threshold_data_independent(opts.sigma1, one)[0, 0]) * n_q
        else:
            f += float(gnmax.rdp_threshold(log_p, opts.sigma1, one).sum())
            maxv = q_counts.max(axis=1)
            if u is not None:
                u += gnss.threshold_ls_bounds(maxv, teachers, opts.threshold, opts.sigma1, order).sum(axis=1)
    ss = None if u is None else gnss.smooth_bound(u, beta)
    eps_at_order = f + math.log(1.0 / delta) / (order - 1)
    released = None
    if rng is not None:
        noise_ss = float(gaussian(rng, 1, opts.ss_sigma)[0]) * ss
        released = min(eps_at_order + noise_ss + release_rdp, eps_di)  # post-processing: a DI bound holds
    return PateReport(
        mechanism,
        n_q,
        teachers,
        classes,
        delta,
        eps_di,
        o_di,
        eps_dd,
        o_dd,
        ss,
        released,
        None,
        beta,
        agreement,
        warnings,
        answered=int(answered.sum()),
        release_order=order,
        release_rdp=release_rdp,
        ss_sigma=opts.ss_sigma,
        eps_data_dependent_at_order=eps_at_order,
    )
