import numpy as np
import pytest
import torch

from dpfl.compression.subset import count_for_ratio, gather, random_subset, scatter
from dpfl.compression.topk import accumulated_abs_grad, topk_indices
from dpfl.errors import ConfigError


def test_count_for_ratio_is_the_exact_floor():
    assert count_for_ratio(0.005, 1_663_370) == 8316
    assert count_for_ratio(0.001, 1_496_601) == 1496
    assert count_for_ratio(0.1, 1_663_370) == 166_337
    assert count_for_ratio(0.07, 100) == 7  # 0.07·100 = 7.000000000000001 in floats
    assert count_for_ratio(0.29, 100) == 29  # 0.29·100 = 28.999999999999996 in floats
    with pytest.raises(ConfigError, match="keeps no coordinate"):
        count_for_ratio(0.001, 10)
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        count_for_ratio(0.0, 10)


def test_random_subset_is_shared_distinct_sorted_and_fresh():
    a = random_subset(1000, 50, np.random.default_rng(3))
    b = random_subset(1000, 50, np.random.default_rng(3))
    c = random_subset(1000, 50, np.random.default_rng(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.int64 and len(torch.unique(a)) == 50 and torch.all(a[1:] > a[:-1])
    u = torch.randn(3, 1000)
    assert torch.equal(gather(u, a), u[:, a])
    back = scatter(gather(u, a)[0], a, 1000)
    assert torch.equal(back[a], u[0, a]) and back.count_nonzero() <= 50


def test_topk_matches_bruteforce_with_ties_to_lower_index():
    scores = torch.tensor([0.5, 3.0, 1.0, 3.0, 0.0, 1.0, 1.0])
    assert topk_indices(scores, 3).tolist() == [1, 2, 3]
    rng = np.random.default_rng(0)
    s = rng.integers(0, 20, 500).astype(np.float64)  # many ties
    ref = np.sort(np.lexsort((np.arange(500), -s))[:37])
    assert topk_indices(torch.from_numpy(s), 37).numpy().tolist() == ref.tolist()
    with pytest.raises(ConfigError, match=r"K must be in \[1, n=7\]"):
        topk_indices(scores, 8)


def test_accumulated_abs_grad_closed_form_on_a_quadratic():
    # f(w) = ½ Σ a_i w_i²: g_t = a·w_t, w_{t+1} = (1 − η a) w_t  ⇒  Σ_t |a w0| |1 − η a|^t
    a = torch.tensor([0.5, -2.0, 4.0, 0.0], dtype=torch.float64)
    w0 = torch.tensor([1.0, 1.0, -1.0, 3.0], dtype=torch.float64)
    eta, steps = 0.1, 5
    got = accumulated_abs_grad(lambda w: a * w, w0, steps, eta)
    expected = sum((a * w0).abs() * (1 - eta * a).abs() ** t for t in range(steps))
    torch.testing.assert_close(got, expected)
    assert topk_indices(got, 2).tolist() == [1, 2]
    with pytest.raises(ConfigError, match="T_init"):
        accumulated_abs_grad(lambda w: w, w0, 0, eta)
