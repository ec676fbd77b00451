"""Confident-GNMax and the GNSS release of GNMax-type ε against closed forms and brute force."""

import json
import math

import numpy as np
import pytest
from pate_reference import all_histograms, gauss, neighbours, noisy_max_probs, smooth_sensitivity_bfs
from scipy import stats
from typer.testing import CliRunner

from dpfl.cli.pate import app
from dpfl.errors import DpflError
from dpfl.pate import analyze, gnmax, gnss
from dpfl.pate.analysis import GaussianOptions
from dpfl.pate.noise import gaussian
from dpfl.pate.votes import UNANSWERED, confident_gnmax
from dpfl.rng import Seeds

ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0])


def _votes(queries=40, teachers=50, m=4, seed=0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(m, 0.3), size=queries)
    return np.stack([rng.multinomial(teachers, pp) for pp in p])


def _consensus_votes(queries, teachers, m, seed):
    """Histograms whose top class holds 60–100% of the votes."""
    rng = np.random.default_rng(seed)
    top = rng.integers(int(0.6 * teachers), teachers + 1, size=queries)
    rest = [rng.multinomial(teachers - t, np.full(m - 1, 1 / (m - 1))) for t in top]
    return np.column_stack([top, np.array(rest)])


def _renyi(p, p2, a):
    """D_α(p || p2) of two finite distributions."""
    p, p2 = np.asarray(p), np.asarray(p2)
    return np.log(np.sum(p**a * p2 ** (1 - a))) / (a - 1)


# ------------------------------------------------------------------ soundness against exact divergences


@pytest.mark.parametrize("teachers, threshold, sigma1", [(8, 6.0, 1.0), (20, 15.0, 3.0), (20, 25.0, 2.0)])
def test_threshold_rdp_dominates_exact_renyi(teachers, threshold, sigma1):
    v = np.arange(teachers + 1)
    log_p = gnmax.log_pr_answered(v, threshold, sigma1)
    log_n = stats.norm.logcdf(threshold - v, scale=sigma1)  # ln Pr[not answered]
    dd = gnmax.rdp_threshold(log_p, sigma1, ORDERS)
    di = gnmax.rdp_threshold_data_independent(sigma1, ORDERS)[0]
    assert np.allclose(di, ORDERS / (2 * sigma1**2), rtol=1e-15)
    assert np.all(dd <= di + 1e-15)
    for i in v:
        for j in (i - 1, i + 1):  # one vote moves: the max vote moves by at most one
            if 0 <= j <= teachers:
                for k, a in enumerate(ORDERS):
                    exact = (
                        np.logaddexp(a * log_p[i] + (1 - a) * log_p[j], a * log_n[i] + (1 - a) * log_n[j])
                    ) / (a - 1)
                    assert exact <= dd[i, k] + 1e-9, (i, j, a)
    assert np.any(dd < di - 1e-3)  # the data-dependent bound is used somewhere


@pytest.mark.parametrize("counts", [[30, 2, 1], [25, 5, 0], [12, 10, 8]])
def test_confident_gnmax_composition_dominates_exact_renyi(counts):
    """Output ⊥ or a class: D_α to every neighbour <= RDP(check) + RDP(GNMax) at the data."""
    threshold, sigma1, sigma2 = 20.0, 4.0, 3.0

    def dist(n):
        p_ans = math.exp(gnmax.log_pr_answered(max(n), threshold, sigma1))
        return np.r_[1 - p_ans, p_ans * noisy_max_probs(n, gauss(sigma2))]

    c = np.array([counts])
    bound = (
        gnmax.rdp_threshold(gnmax.log_pr_answered(c.max(1), threshold, sigma1), sigma1, ORDERS)
        + gnmax.rdp_data_dependent(gnmax.log_q_bound(c, sigma2), sigma2, ORDERS)
    )[0]
    assert np.all(bound <= ORDERS / (2 * sigma1**2) + ORDERS / sigma2**2 + 1e-15)
    p = dist(counts)
    for nb in neighbours(counts):
        p2 = dist(nb)
        assert all(_renyi(p, p2, a) <= b + 1e-9 for a, b in zip(ORDERS, bound, strict=True))


# ------------------------------------------------------------------ limits and closed forms


def test_minus_infinite_threshold_is_gnmax_whatever_sigma1():
    counts = _votes()
    opts = GaussianOptions(order=8.0, ss_sigma=3.0)
    g = analyze(counts, mechanism="gnmax", noise=6.0, gauss=opts, rng=Seeds(5).crypto("r"))
    for s1 in (0.5, 80.0):
        c = GaussianOptions(threshold=-np.inf, sigma1=s1, order=8.0, ss_sigma=3.0)
        r = analyze(counts, mechanism="confident-gnmax", noise=6.0, gauss=c, rng=Seeds(5).crypto("r"))
        for key in (
            "eps_data_independent",
            "eps_data_dependent",
            "order_data_dependent",
            "smooth_sensitivity",
            "eps_data_dependent_at_order",
            "eps_data_dependent_released",
        ):
            assert getattr(r, key) == getattr(g, key), key
    assert g.eps_data_dependent < g.eps_data_independent and g.smooth_sensitivity > 0


def test_data_independent_closed_form_and_upper_bound():
    counts = _votes(queries=30)
    labels = counts.argmax(1)
    labels[::3] = UNANSWERED  # 10 of 30 not answered
    t, s1, s2, delta = 35.0, 12.0, 7.0, 1e-6
    opts = GaussianOptions(threshold=t, sigma1=s1)
    r = analyze(counts, labels=labels, mechanism="confident-gnmax", noise=s2, delta=delta, gauss=opts)
    orders = gnmax.default_orders()
    closed = np.min(30 * orders / (2 * s1**2) + 20 * orders / s2**2 + math.log(1 / delta) / (orders - 1))
    assert r.eps_data_independent == pytest.approx(closed, rel=1e-12) and r.answered == 20
    assert r.eps_data_dependent <= r.eps_data_independent
    assert r.label_agreement == 1.0
    # step 1 charged data-independently: Q·α/(2σ1²) + Σ_answered GNMax data-dependent
    ind = analyze(
        counts,
        labels=labels,
        mechanism="confident-gnmax",
        noise=s2,
        delta=delta,
        gauss=GaussianOptions(threshold=t, sigma1=s1, threshold_data_independent=True),
    )
    ans = labels != UNANSWERED
    dd2 = gnmax.rdp_data_dependent(gnmax.log_q_bound(counts[ans], s2), s2, orders).sum(0)
    expect = np.min(30 * orders / (2 * s1**2) + dd2 + math.log(1 / delta) / (orders - 1))
    assert ind.eps_data_dependent == pytest.approx(expect, rel=1e-12)
    assert r.eps_data_dependent <= ind.eps_data_dependent <= ind.eps_data_independent
    # without released labels every query is charged for step 2 (an upper bound)
    nolab = analyze(counts, mechanism="confident-gnmax", noise=s2, delta=delta, gauss=opts)
    assert nolab.answered == 30 and nolab.eps_data_dependent >= r.eps_data_dependent
    assert any("upper bound" in w for w in nolab.warnings)


def test_monotone_in_answers_and_noise():
    counts = _votes(queries=30, seed=1)
    opts = GaussianOptions(threshold=30.0, sigma1=10.0)
    prev_dd = prev_di = -np.inf
    for k in (0, 10, 20, 30):  # more answered queries cost more
        lab = np.full(30, UNANSWERED)
        lab[:k] = counts[:k].argmax(1)
        r = analyze(counts, labels=lab, mechanism="confident-gnmax", noise=6.0, gauss=opts)
        assert r.eps_data_dependent >= prev_dd and r.eps_data_independent >= prev_di
        prev_dd, prev_di = r.eps_data_dependent, r.eps_data_independent
    eps = [
        analyze(counts, mechanism="confident-gnmax", noise=s2, gauss=GaussianOptions(30.0, s1))
        for s1, s2 in ((5.0, 5.0), (10.0, 5.0), (10.0, 10.0))
    ]
    assert eps[0].eps_data_independent > eps[1].eps_data_independent > eps[2].eps_data_independent
    assert eps[0].eps_data_dependent >= eps[1].eps_data_dependent >= eps[2].eps_data_dependent


@pytest.mark.parametrize("sigma", [1.0, 4.0, 40.0])
def test_gnmax_rdp_is_non_decreasing_in_q(sigma):
    """The paper's condition C5, which the smooth-sensitivity bracketing relies on."""
    grid = np.linspace(-5000.0, 0.0, 50001)
    for order in (1.5, 3.0, 10.0, 50.0):
        f = gnss.gnmax_rdp_at(grid, np.full(grid.shape, sigma), order)
        assert np.all(np.diff(f) >= -1e-12)
        assert f[0] < f[-1] == pytest.approx(order / sigma**2)


# ------------------------------------------------------------------ smooth sensitivity (brute force)


@pytest.mark.parametrize("step", ["gnmax", "threshold", "both"])
def test_smooth_sensitivity_is_a_smooth_upper_bound(step):
    teachers, m, sigma2, threshold, sigma1, order, beta = 8, 3, 1.5, 6.0, 1.0, 2.0, 0.2
    vs = np.array(all_histograms(teachers, m), dtype=float)
    f = np.zeros(len(vs))
    u = np.zeros((teachers + 1, len(vs)))
    if step in ("gnmax", "both"):
        f += gnss.gnmax_rdp_at(gnmax.log_q_bound(vs, sigma2), np.full(len(vs), sigma2), order)
        u += gnss.gnmax_ls_bounds(vs, np.full(len(vs), sigma2), order)
    if step in ("threshold", "both"):
        maxv = vs.max(1)
        f += gnmax.rdp_threshold(gnmax.log_pr_answered(maxv, threshold, sigma1), sigma1, [order])[:, 0]
        u += gnss.threshold_ls_bounds(maxv, teachers, threshold, sigma1, order)
    exact, nbs = smooth_sensitivity_bfs(vs.astype(int).tolist(), f, beta)
    ours = np.array([gnss.smooth_bound(u[:, i], beta) for i in range(len(vs))])
    assert exact.max() > 0.05  # not a trivial case
    assert np.all(ours >= exact - 1e-12)
    for i, nb in enumerate(nbs):  # β-smooth: S(n) <= e^β S(n')
        assert np.all(ours[i] <= math.exp(beta) * ours[nb] + 1e-12)


def test_capped_q_has_zero_sensitivity():
    """One teacher, σ = 100: q̃ is capped at 1 − 1/m for every histogram, so RDP is constant."""
    u = gnss.gnmax_ls_bounds(np.array([[1.0, 0.0, 0.0]]), np.array([100.0]), 2.0)
    assert u.shape == (2, 1) and np.all(u == 0)


def test_gnss_rdp_closed_form_and_range():
    beta, s, lam = 0.02, 4.0, 10.0
    closed = lam * math.exp(2 * beta) / s**2 + (beta * lam - 0.5 * math.log(1 - 2 * lam * beta)) / (lam - 1)
    assert gnss.gnss_rdp(beta, s, lam) == pytest.approx(closed, rel=1e-15)
    with pytest.raises(DpflError, match="1/\\(2β\\)"):
        gnss.gnss_rdp(0.1, s, 5.0)  # λ = 1/(2β) is outside


def test_release_is_the_noised_value_and_reproducible():
    counts = _consensus_votes(200, 100, 4, seed=2)
    opts = GaussianOptions(threshold=60.0, sigma1=20.0, order=6.0, ss_sigma=2.0)
    run = [
        analyze(counts, mechanism="confident-gnmax", noise=5.0, gauss=opts, rng=Seeds(k).crypto("r"))
        for k in (3, 3, 4)
    ]
    a = run[0]
    assert a.eps_data_dependent_released == run[1].eps_data_dependent_released
    assert a.eps_data_dependent_released != run[2].eps_data_dependent_released
    z = float(gaussian(Seeds(3).crypto("r"), 1, 2.0)[0])
    assert a.beta == pytest.approx(0.4 / 6.0) and a.release_rdp == gnss.gnss_rdp(a.beta, 2.0, 6.0)
    expect = a.eps_data_dependent_at_order + z * a.smooth_sensitivity + a.release_rdp
    assert a.eps_data_dependent_released == pytest.approx(expect, rel=1e-12)
    assert a.eps_data_dependent_released < a.eps_data_independent  # not clipped by the DI bound
    assert a.smooth_sensitivity > 0 and not any("chosen from the raw votes" in w for w in a.warnings)


# ------------------------------------------------------------------ the aggregator


def test_confident_gnmax_output_distribution():
    counts = np.array([5.0, 4.0, 2.0])
    t, s1, s2, n = 6.0, 1.5, 1.5, 40000
    p_ans = stats.norm.sf(t - 5.0, scale=s1)
    exact = np.r_[1 - p_ans, p_ans * noisy_max_probs(counts, gauss(s2))]
    out = confident_gnmax(np.tile(counts, (n, 1)), t, s1, s2, Seeds(2).crypto("c"))
    observed = np.bincount(out + 1, minlength=4)
    assert stats.chisquare(observed, exact * n).pvalue > 1e-3
    again = confident_gnmax(np.tile(counts, (n, 1)), t, s1, s2, Seeds(2).crypto("c"))
    assert np.array_equal(out, again)
    for bad in ((float("nan"), 1.0), (1.0, 0.0), (np.inf, 1.0)):
        with pytest.raises(DpflError, match="Confident-GNMax"):
            confident_gnmax(np.tile(counts, (2, 1)), *bad, s2, Seeds(2).crypto("c"))


def test_input_errors():
    counts = _votes(queries=5)
    with pytest.raises(DpflError, match="needs a threshold"):
        analyze(counts, mechanism="confident-gnmax", noise=5.0)
    with pytest.raises(DpflError, match="belong to confident-gnmax"):
        analyze(counts, mechanism="gnmax", noise=5.0, gauss=GaussianOptions(threshold=3.0, sigma1=1.0))
    with pytest.raises(DpflError, match="class ids"):
        analyze(counts, labels=np.full(5, UNANSWERED), mechanism="gnmax", noise=5.0)
    with pytest.raises(DpflError, match="release order"):
        analyze(counts, mechanism="gnmax", noise=5.0, gauss=GaussianOptions(order=1.0))
    with pytest.raises(DpflError, match="not lnmax"):
        analyze(counts, noise=0.1, gauss=GaussianOptions(order=8.0))


def test_cli_confident_gnmax(tmp_path):
    path = tmp_path / "votes.npz"
    counts = _votes(queries=50, teachers=100, m=10, seed=3)
    np.savez(path, counts=counts)
    args = ["analyze", str(path), "--aggregator", "confident-gnmax", "--noise", "20", "--sigma1", "30"]
    res = CliRunner().invoke(app, [*args, "--threshold", "60", "--order", "10", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    direct = analyze(
        counts,
        mechanism="confident-gnmax",
        noise=20.0,
        gauss=GaussianOptions(threshold=60.0, sigma1=30.0, order=10.0),
        rng=Seeds(1).crypto("pate", "release"),
    )
    assert rep == json.loads(json.dumps(direct.to_dict()))
    table = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, [*args, "--threshold", "60", "--order", "10", "--seed", "1"]
    )
    assert "smooth-sensitivity release" in table.stdout and "GNSS" in table.stdout
    missing = CliRunner().invoke(app, args)
    assert missing.exit_code == 2 and "error: confident-gnmax needs a threshold" in missing.output


def test_no_release_when_the_monotonicity_check_fails(monkeypatch):
    def refuse(*args):
        raise gnss.NotMonotoneError("not monotone (forced)")

    monkeypatch.setattr(gnss, "gnmax_ls_bounds", refuse)
    r = analyze(_votes(queries=5), mechanism="gnmax", noise=5.0, rng=Seeds(0).crypto("r"))
    assert r.eps_data_dependent_released is None and r.smooth_sensitivity is None
    assert any("no smooth-sensitivity release" in w for w in r.warnings)
