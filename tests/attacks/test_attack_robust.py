import itertools

import numpy as np
import pytest
import torch
from attack_helpers import round_ctx
from scipy import stats

from dpfl.errors import ConfigError
from dpfl.schemes import robust
from dpfl.schemes.aggregators import build_aggregator
from dpfl.schemes.base import Received


def received(rows):
    return Received(rows=rows, total=rows.sum(0), count=rows.shape[0],
                    upstream_bytes=np.zeros(rows.shape[0], dtype=np.int64))


def honest_with_outlier(k, n, seed=0, scale=1e4):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(k, n, generator=g) * 0.1 + 0.5
    rows[2] = scale  # the planted outlier
    return rows


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(robust, "_CHUNK", 7)  # exercise the block loops


@pytest.mark.parametrize("k", [7, 8])
def test_median_matches_numpy_and_ignores_the_outlier(k, small_chunks):
    rows = honest_with_outlier(k, 50)
    agg = build_aggregator("median", {})
    out = agg(received(rows), round_ctx(k, 50))
    ref = np.median(rows.numpy().astype(np.float64), axis=0)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    assert out.abs().max() < 1.0  # the outlier (1e4) moved nothing out of the honest range
    assert (received(rows).total / k).abs().min() > 1000  # while the plain mean is ruined


@pytest.mark.parametrize("trim", [0.0, 0.1, 0.25])
def test_trimmed_mean_matches_scipy(trim, small_chunks):
    k, n = 10, 40
    rows = honest_with_outlier(k, n, seed=1)
    out = build_aggregator("trimmed-mean", {"trim": trim})(received(rows), round_ctx(k, n))
    ref = stats.trim_mean(rows.numpy().astype(np.float64), trim, axis=0)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    if trim > 0:
        assert out.abs().max() < 1.0


def brute_krum_scores(x, f):
    k = len(x)
    scores = []
    for i in range(k):
        d = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in range(k) if j != i)
        scores.append(sum(d[: k - f - 2]))
    return np.array(scores)


def test_krum_and_multi_krum_match_a_brute_force_reference(small_chunks):
    k, n, f = 9, 30, 2
    rows = honest_with_outlier(k, n, seed=2, scale=50.0)
    rows[5] = -40.0  # a second attacker
    x = rows.numpy().astype(np.float64)
    ref_scores = brute_krum_scores(x, f)
    np.testing.assert_allclose(robust.krum_scores(rows, f).numpy(), ref_scores, rtol=1e-9)
    order = np.argsort(ref_scores, kind="stable")
    ctx = round_ctx(k, n, malicious=np.isin(np.arange(k), [2, 5]))
    krum = build_aggregator("krum", {"f": f})(received(rows), ctx)
    assert torch.equal(krum, rows[order[0]])
    assert ctx.metrics["robust_malicious_selected"] == 0
    mk = build_aggregator("multi-krum", {"f": f, "m": 4})(received(rows), ctx)
    np.testing.assert_allclose(mk.numpy(), x[order[:4]].mean(0), rtol=1e-6)
    default_m = build_aggregator("multi-krum", {"f": f})(received(rows), ctx)  # m = k − f: both attackers out
    np.testing.assert_allclose(default_m.numpy(), np.delete(x, [2, 5], axis=0).mean(0), rtol=1e-6)


def test_krum_needs_enough_updates():
    rows = torch.randn(6, 5)
    with pytest.raises(ConfigError, match=r"2f \+ 3 = 7"):
        build_aggregator("krum", {"f": 2})(received(rows), round_ctx(6, 5))


def test_norm_bound_clips_the_outlier_like_a_numpy_reference():
    k, n, bound = 6, 20, 1.5
    rows = honest_with_outlier(k, n, seed=3, scale=100.0)
    w = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 2.0])
    ctx = round_ctx(k, n)
    ctx.weights = w
    out = build_aggregator("norm-bound", {"bound": bound})(received(rows), ctx)
    x = rows.numpy().astype(np.float64)
    norms = np.linalg.norm(x, axis=1)
    ref = (w.numpy()[:, None] * x * np.minimum(1, bound / norms)[:, None]).sum(0) / w.sum().item()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    assert ctx.metrics["robust_clipped"] == float((norms > bound).sum())
    assert np.linalg.norm(out.numpy()) <= bound + 1e-5  # a convex combination of bounded rows


def test_sign_vote_rejects_values_outside_plus_minus_one():
    k, n = 5, 12
    g = torch.Generator().manual_seed(4)
    rows = (torch.randint(0, 2, (k, n), generator=g) * 2 - 1).to(torch.float32)
    boosted = rows.clone()
    boosted[1] *= 5000  # the attacker's boosted signs
    boosted[3, 0] = 0.0  # not a sign either
    ctx = round_ctx(k, n)
    out = build_aggregator("sign-vote", {})(received(boosted), ctx)
    assert ctx.metrics["robust_rejected"] == 2
    assert torch.equal(out, rows[[0, 2, 4]].sum(0))
    clean = build_aggregator("sign-vote", {})(received(rows), round_ctx(k, n))
    assert torch.equal(clean, rows.sum(0))


@pytest.mark.parametrize("name", list(robust.RULES))
def test_robust_rules_refuse_secure_aggregation(name):
    from dpfl.schemes.registry import Scheme
    from dpfl.schemes.secure_sum import SecAggTransport

    opts = {"norm-bound": {"bound": 1.0}}.get(name, {})
    agg = build_aggregator(name, opts)
    assert agg.needs_rows
    scheme = Scheme("x", [], SecAggTransport("fixed", clip_range=1.0), agg)
    with pytest.raises(ConfigError, match="secure aggregation"):
        scheme.setup(type("S", (), {})())  # the check comes before any use of the context
    with pytest.raises(ConfigError, match="secure aggregation hides individual updates"):
        agg(Received(rows=None, total=torch.zeros(3), count=4, upstream_bytes=np.zeros(4)), round_ctx(4, 3))


@pytest.mark.parametrize("name,opts,msg", [
    ("trimmed-mean", {"trim": 0.5}, r"\[0, 0.5\)"), ("krum", {"f": -1}, "integer ≥ 0"),
    ("multi-krum", {"m": 0}, "integer ≥ 1"), ("norm-bound", {"bound": 0}, "> 0"),
    ("norm-bound", {}, "bound"), ("median", {"x": 1}, "takes no arguments")])
def test_bad_options_are_named(name, opts, msg):
    with pytest.raises(ConfigError, match=msg):
        build_aggregator(name, opts)


def test_median_of_every_small_multiset_equals_numpy():
    vals = [-2.0, 0.0, 1.5, 7.0]
    for k in (1, 2, 3, 4):
        for combo in itertools.product(vals, repeat=k):
            rows = torch.tensor(combo, dtype=torch.float32)[:, None]
            assert robust.coordinate_median(rows).item() == pytest.approx(np.median(combo))
