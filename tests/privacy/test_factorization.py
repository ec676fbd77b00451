"""Correlated-noise mechanisms (dpfl.privacy.factorization, .correlated, .participation): the factorizations,
their noise streams against the direct computation C⁻¹Z (exactly for the linear map, empirically for the
CryptoRNG draws), the sensitivity against a brute-force maximum over participation patterns, ε against
dp-accounting, and selections that keep to their schema."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpfl.cli.privacy import app
from dpfl.errors import PrivacyError
from dpfl.privacy import GaussianEvent, Ledger
from dpfl.privacy import factorization as F
from dpfl.privacy import participation as P
from dpfl.privacy.correlated import BandNoise, TreeNoise
from dpfl.rng import Seeds

TREES = [(8, None, True), (7, None, True), (7, None, False), (10, 4, True), (10, 4, False), (13, 5, True), (1, None, True)]


# ---------------------------------------------------------------- the factorizations


@pytest.mark.parametrize("T,restart,completion", TREES)
def test_the_tree_factorizes_the_prefix_sums(T, restart, completion):
    mf = F.tree(T, restart, completion)
    a = F.prefix_workload(T)
    assert np.array_equal(mf.noise_map @ mf.encoder, np.eye(T))  # F C = I: x̂ = F (C x + Z)
    assert np.array_equal((a @ mf.noise_map) @ mf.encoder, a)  # B C = A
    assert set(np.unique(mf.encoder)) <= {0.0, 1.0} and len(mf.keys) == mf.encoder.shape[0]


@pytest.mark.parametrize("T", [1, 2, 5, 8, 13, 16, 100])
def test_one_participation_in_a_tree_costs_one_node_per_level(T):
    """Kairouz et al.'s bound ⌈log₂T⌉ + 1 with completion (the root is a row); ⌊log₂T⌋ + 1 without."""
    for completion, levels in ((True, math.ceil(math.log2(T)) + 1), (False, math.floor(math.log2(T)) + 1)):
        s2, exact = F.sensitivity_squared(F.tree(T, None, completion).encoder, "min-separation", T)
        assert exact and s2[-1] == levels


def test_completion_reads_each_segments_sum_from_its_root():
    mf = F.tree(12, 5, True)  # segments 5, 5, 2
    b = F.prefix_workload(12) @ mf.noise_map
    col = {k: j for j, k in enumerate(mf.keys)}
    assert np.flatnonzero(b[4]).tolist() == [col[(0, 3, 0)]]  # round 5: the completed root of segment 0
    assert np.flatnonzero(b[9]).tolist() == sorted([col[(0, 3, 0)], col[(1, 3, 0)]])
    plain = F.prefix_workload(12) @ F.tree(12, 5, False).noise_map
    assert np.count_nonzero(plain[4]) == 2  # 5 = 4 + 1 without completion


@pytest.mark.parametrize("T,b", [(12, 1), (12, 3), (30, 6)])
def test_bandmf_is_banded_with_unit_columns_and_beats_its_start(T, b):
    mf = F.bandmf(T, b)
    c = mf.encoder
    i, j = np.indices(c.shape)
    assert np.all(c[(i < j) | (i - j >= b)] == 0) and np.all(np.diag(c) != 0)
    assert np.allclose(np.sqrt((c * c).sum(0)), 1, atol=1e-12)
    assert np.allclose(mf.noise_map @ c, np.eye(T), atol=1e-10)
    a = F.prefix_workload(T)
    if b == 1:
        assert np.array_equal(c, np.eye(T))
        return
    start = F._normalise(np.where((i >= j) & (i - j < b), F._toeplitz_sqrt(T)[np.maximum(i - j, 0)], 0.0))
    assert mf.workload_error() < np.sum((a @ np.linalg.inv(start)) ** 2) < np.sum(a * a)


def test_bandmf_for_a_momentum_workload_is_optimised_for_it():
    T, b, beta = 24, 4, 0.9
    a = F.momentum_workload(T, beta)
    assert a[3, 1] == pytest.approx(1 + beta + beta ** 2)
    mom, plain = F.bandmf(T, b, a), F.bandmf(T, b)
    assert mom.workload_error(a) < plain.workload_error(a)


# ---------------------------------------------------------------- sensitivity: brute force on small T


def _patterns(r, schema, b):
    for m in range(1, 1 << r):
        idx = [i for i in range(r) if m >> i & 1]
        if schema == "cyclic" and len({i % b for i in idx}) > 1:
            continue
        if schema == "min-separation" and any(j - i < b for i, j in itertools.pairwise(idx)):
            continue
        yield idx


def _brute(c, schema, b, r):
    """max ‖C u‖² over the patterns within the first r rounds, u_t = ±1 in the pattern's rounds."""
    best = 0.0
    for idx in _patterns(r, schema, b):
        for signs in itertools.product((1.0, -1.0), repeat=len(idx) - 1):
            u = np.zeros(c.shape[1])
            u[idx] = (1.0, *signs)
            best = max(best, float(np.sum((c @ u) ** 2)))
    return best


SCHEMAS = [("any", 1), ("cyclic", 2), ("cyclic", 3), ("min-separation", 2), ("min-separation", 3)]


@pytest.mark.parametrize("name", ["tree", "tree-restart", "tree-restart-plain", "bandmf-3", "bandmf-1", "random"])
@pytest.mark.parametrize("T", [7, 9])
def test_sensitivity_is_the_brute_force_maximum_over_participation_patterns(name, T):
    """For every schema and every prefix r ≤ T: equal to the brute force where it says exact (and it is for
    the tree under any/cyclic and restart ≤ separation, and for BandMF with bands ≤ separation), never below
    it where it says upper bound."""
    c = {"tree": lambda: F.tree(T).encoder, "tree-restart": lambda: F.tree(T, 3).encoder,
         "tree-restart-plain": lambda: F.tree(T, 3, False).encoder, "bandmf-3": lambda: F.bandmf(T, 3).encoder,
         "bandmf-1": lambda: F.bandmf(T, 1).encoder,
         "random": lambda: np.tril(np.random.default_rng(T).normal(size=(T, T)))}[name]()
    for schema, b in SCHEMAS:
        s2, exact = F.sensitivity_squared(c, schema, b)
        assert np.all(np.diff(s2) >= 0)
        brute = [_brute(c, schema, b, r) for r in range(1, T + 1)]
        if exact:
            np.testing.assert_allclose(s2, brute, rtol=1e-12, atol=1e-12)
        else:
            assert np.all(s2 >= np.array(brute) - 1e-9)
        if name.startswith("bandmf") and int(name[-1]) <= b and schema != "any":
            assert exact and s2[-1] == pytest.approx(-(-T // b) if schema == "min-separation" else
                                                      max(len(range(g, T, b)) for g in range(b)))
        if name.startswith("tree") and schema != "min-separation":
            assert exact  # CᵀC ≥ 0: the same vector in every round attains Σ G_ij
        if name == "tree-restart" and schema == "min-separation" and b >= 3:
            assert exact  # one participation per tree


# ---------------------------------------------------------------- the noise streams


def _probe(m, index):
    """draw(key) -> the basis vector of key's row: the stream's output is then its row of F exactly."""
    def draw(key):
        out = torch.zeros(m, dtype=torch.float64)
        out[index[key]] = 1.0
        return out

    return draw


@pytest.mark.parametrize("T,restart,completion", TREES)
def test_the_tree_stream_is_the_linear_map_F(T, restart, completion):
    mf = F.tree(T, restart, completion)
    draw = _probe(len(mf.keys), {k: j for j, k in enumerate(mf.keys)})
    rows = torch.stack([TreeNoise(mf).noise(t, draw) for t in range(1, T + 1)]).numpy()
    assert np.array_equal(rows, mf.noise_map)
    drawn = sum(len(TreeNoise(mf).terms(t)) for t in range(1, T + 1))
    assert drawn <= 2 * T  # only the nodes that change are drawn


@pytest.mark.parametrize("T,b", [(9, 1), (9, 3), (16, 5)])
def test_the_band_stream_is_C_inverse_and_skipped_rounds_keep_their_noise(T, b):
    mf = F.bandmf(T, b)
    draw = _probe(T, {(t,): t - 1 for t in range(1, T + 1)})
    s = BandNoise(mf)
    rows = np.stack([s.noise(t, draw).numpy() for t in range(1, T + 1)])
    np.testing.assert_allclose(rows, np.linalg.inv(mf.encoder), rtol=0, atol=1e-12)
    skip = BandNoise(mf)  # rounds 2 and 3 released nothing: round 4 is still C⁻¹'s row 4
    skip.noise(1, draw)
    np.testing.assert_allclose(skip.noise(4, draw).numpy(), rows[3], atol=1e-12)
    assert len(skip.rows) == min(b - 1, 4)
    with pytest.raises(PrivacyError, match="drawn already"):
        skip.noise(4, draw)


def _empirical(stream, T, n, seed):
    """[T, n]: the stream's rounds with Z's rows from CryptoRNG keys (each coordinate one sample path)."""
    seeds = Seeds(seed)

    def draw(key):
        return seeds.crypto("test", *key).gaussian_into(torch.empty(n, dtype=torch.float64), 1.0)

    return torch.stack([stream.noise(t, draw) for t in range(1, T + 1)]).numpy()


@pytest.mark.parametrize("mech", ["tree", "tree-restart", "bandmf"])
def test_the_streams_covariance_is_F_F_transpose(mech):
    """40,000 coordinates are 40,000 independent sample paths of the T = 8 rounds: their covariance is
    F Fᵀ (σ = 1) within 6 standard errors, entry by entry (and zero mean)."""
    T, n = 8, 40_000
    mf = {"tree": lambda: F.tree(T), "tree-restart": lambda: F.tree(T, 3), "bandmf": lambda: F.bandmf(T, 3)}[mech]()
    stream = TreeNoise(mf) if mf.name == "tree" else BandNoise(mf)
    z = _empirical(stream, T, n, seed=3)
    cov, want = z @ z.T / n, mf.noise_map @ mf.noise_map.T
    se = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want ** 2) / n)  # std error of a Gaussian covariance
    assert np.all(np.abs(cov - want) < 6 * se)
    assert np.all(np.abs(z.mean(1)) < 6 * np.sqrt(np.diag(want) / n))
    if mech == "bandmf":  # the whole linear map: C z̃ is white
        w = mf.encoder @ z
        assert np.all(np.abs(w @ w.T / n - np.eye(T)) < 6 * np.sqrt(2 / n))


# ---------------------------------------------------------------- accounting


def test_the_run_is_the_gaussian_mechanism_of_its_sensitivity():
    """ρ adds up to Δ²/(2σ²); rdp equals one Gaussian event of multiplier σ/Δ; pld and the exact Balle–Wang ε
    agree with dp-accounting's PLD of that Gaussian."""
    from dp_accounting import GaussianDpEvent
    from dp_accounting.pld import PLDAccountant

    _, s2, exact = F.build("bandmf", 40, "cyclic", 8)
    assert exact and s2[-1] == pytest.approx(5, rel=1e-12)
    sigma, delta = 3.1, 1e-5
    events = F.run_events(sigma, s2)
    assert sum(1 / e.noise_multiplier ** 2 for e in events) == pytest.approx(5 / sigma ** 2, rel=1e-12)
    one = Ledger("rdp")
    one.add(GaussianEvent(sigma / math.sqrt(5)))
    assert F.run_epsilon(sigma, s2, delta, "rdp") == pytest.approx(one.epsilon(delta), rel=1e-12)
    acc = PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(GaussianDpEvent(sigma / math.sqrt(5)))
    ref = acc.get_epsilon(delta)
    exact_eps = F.gaussian_epsilon(sigma / math.sqrt(5), delta)
    assert exact_eps <= ref <= exact_eps * (1 + 2e-3)
    assert exact_eps <= F.run_epsilon(sigma, s2, delta, "pld") <= exact_eps * (1 + 2e-3)
    from dpfl.privacy.calibration import analytic_gaussian_delta

    assert analytic_gaussian_delta(sigma, exact_eps, math.sqrt(5)) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibration_reaches_the_target_and_no_less_noise_does(accountant):
    _, s2, _ = F.build("tree", 30, "cyclic", 5, restart=5)
    sigma = F.calibrate(2.0, 1e-5, s2, accountant)
    assert F.run_epsilon(sigma, s2, 1e-5, accountant) <= 2.0 < F.run_epsilon(sigma / (1 + 2e-5), s2, 1e-5, accountant)


def test_an_increment_waits_for_a_round_that_releases():
    s2 = np.array([1.0, 1.0, 2.0, 2.0, 3.0])
    e1, acc = F.round_event(2.0, s2, 0.0, 1)
    assert e1.noise_multiplier == 2.0 and acc == 1.0
    assert F.round_event(2.0, s2, acc, 2) == (None, 1.0)
    # round 3 released nothing (its Δ² was not accounted): round 5 charges both increments
    e5, acc5 = F.round_event(2.0, s2, 1.0, 5)
    assert e5.noise_multiplier == pytest.approx(2.0 / math.sqrt(2)) and acc5 == 3.0


# ---------------------------------------------------------------- participation schemas and selection


@pytest.mark.parametrize("schema,b", [("cyclic", 4), ("min-separation", 3)])
def test_selections_keep_to_their_schema_and_replay_from_the_seed(schema, b):
    n, k, T = 40, 5, 30
    seeds = Seeds(7)
    rounds = [P.select(schema, b, n, k, r, seeds) for r in range(1, T + 1)]
    P._SCHEDULES.clear()
    assert all(np.array_equal(a, P.select(schema, b, n, k, r, Seeds(7))) for r, a in zip(range(T, 0, -1),
                                                                                       reversed(rounds)))
    seen: dict[int, list[int]] = {}
    for r, c in enumerate(rounds, 1):
        assert len(c) == k == len(set(c.tolist())) and np.all(np.diff(c) > 0)
        for x in c.tolist():
            seen.setdefault(x, []).append(r)
    for rs in seen.values():
        gaps = np.diff(rs)
        assert np.all(gaps >= b)
        if schema == "cyclic":
            assert np.all(gaps % b == 0) and len(rs) <= P.max_participations(schema, b, T)
    assert len(seen) > k * b // 2  # not the same few clients


def test_a_selection_that_cannot_keep_to_its_schema_is_refused():
    with pytest.raises(PrivacyError, match="groups of 9, fewer than the cohort of 10"):
        P.check_selection("cyclic", 11, 100, 10)
    with pytest.raises(PrivacyError, match="at least 11 × 10 = 110 clients"):
        P.check_selection("min-separation", 11, 100, 10)
    with pytest.raises(PrivacyError, match="needs a client's rounds ≥ 5 apart"):
        F.build("bandmf", 20, "cyclic", 4, bands=5)


# ---------------------------------------------------------------- the CLI


runner = CliRunner()


def _json(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


def test_cli_epsilon_and_sigma_of_a_correlated_mechanism():
    base = ["--correlated", "bandmf", "--participation", "cyclic", "--separation", "10", "--steps", "50"]
    out = _json(["epsilon", *base, "--sigma", "2.5", "--accountant", "pld", "--json"])
    assert out["sensitivity"] == pytest.approx(math.sqrt(5)) and out["sensitivity_exact"] is True
    assert out["rho"] == pytest.approx(5 / (2 * 2.5 ** 2))
    _, s2, _ = F.build("bandmf", 50, "cyclic", 10)
    assert out["epsilon"] == F.run_epsilon(2.5, s2, 1e-5, "pld")
    assert out["epsilon_exact"] == pytest.approx(F.gaussian_epsilon(2.5 / math.sqrt(5), 1e-5))
    sig = _json(["sigma", *base, "--epsilon", str(out["epsilon"]), "--accountant", "rdp", "--json"])
    assert sig["sigma"] == F.calibrate(out["epsilon"], 1e-5, s2, "rdp")
    bad = runner.invoke(app, ["epsilon", *base, "--sigma", "1", "--q", "0.1"])
    assert bad.exit_code != 0 and "not on sampling" in bad.output
    bad = runner.invoke(app, ["epsilon", *base, "--sigma", "1", "--restart", "4"])
    assert bad.exit_code != 0 and "--restart" in bad.output


def test_prefix_variances_are_each_rounds_model_noise():
    """‖(A F)_t‖²: t for independent noise (one band); for any factorization, the variance of the
    t-th prefix of B Z measured on draws, and their mean is the CLI's prefix_variance."""
    assert np.allclose(F.bandmf(12, 1).prefix_variances(), np.arange(1, 13))
    mf = F.bandmf(12, 4)
    z = np.random.default_rng(0).standard_normal((12, 200_000))
    measured = np.var(F.prefix_workload(12) @ mf.noise_map @ z, axis=1)
    assert np.allclose(measured, mf.prefix_variances(), rtol=0.02)
    res = CliRunner().invoke(app, ["epsilon", "--correlated", "bandmf", "--participation", "cyclic", "--separation",
                                   "4", "--sigma", "2", "--steps", "12", "--accountant", "rdp", "--json"])
    out = json.loads(res.output.splitlines()[-1])
    assert out["prefix_variance_first"] == pytest.approx(mf.prefix_variances()[0])
    assert out["prefix_variance_last"] == pytest.approx(mf.prefix_variances()[-1])
    assert out["prefix_variance"] == pytest.approx(mf.workload_error() / 12)
