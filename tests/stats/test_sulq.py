"""SuLQ counts: unbiased with the stated noise, ledger = Gaussian of that σ (vs dp-accounting),
federated shares, confidence tracking vs its closed-form mean."""

import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from dp_accounting.pld import privacy_loss_distribution as pld

from dpfl.errors import BudgetExceededError, ConfigError, DataError
from dpfl.privacy.ledger import Budget, Ledger
from dpfl.privacy.rdp import DEFAULT_ORDERS
from dpfl.stats import SuLQ, conf, posterior_confidence


def test_counts_are_unbiased_with_std_sigma():
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 10, size=(n, 2)) for n in (50, 80, 30)]
    true = sum(int((r[:, 0] > 4).sum()) for r in rows)
    q = SuLQ(rows, sigma=3.0, random_state=0)
    answers = np.array([q.query(lambda r: (r[:, 0] > 4).astype(int)) for _ in range(600)])
    assert answers.mean() == pytest.approx(true, abs=4 * 3.0 / np.sqrt(600))
    assert answers.std() == pytest.approx(3.0, rel=0.1)
    assert q.n_queries == 600


def test_ledger_matches_dp_accounting_gaussian():
    q = SuLQ([np.arange(10)], sigma=4.0, random_state=0)
    for _ in range(5):
        q.query(lambda r: (r % 2 == 0).astype(int))
    # a count moves by at most 1 when one record is replaced: Gaussian, sensitivity 1, 5 times
    acc = rdp.RdpAccountant(list(DEFAULT_ORDERS))
    acc.compose(dp_event.GaussianDpEvent(4.0), 5)
    assert q.ledger.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)
    exact = pld.from_gaussian_mechanism(4.0, sensitivity=1.0).self_compose(5).get_epsilon_for_delta(1e-5)
    assert exact * (1 - 1e-3) <= q.ledger.epsilon(1e-5) <= exact * 1.15  # RDP is a little loose


def test_budget_caps_queries():
    led = Ledger("rdp", "replace_one", Budget(1.0, 1e-5))
    q = SuLQ([np.arange(100)], sigma=10.0, random_state=0, ledger=led)
    with pytest.raises(BudgetExceededError):
        for _ in range(10_000):
            q.query(lambda r: (r < 50).astype(int))
    assert 1 < q.n_queries < 10_000


def test_confidence_tracking():
    assert conf(0.5) == 0.0 and conf(0.75) == pytest.approx(np.log(3))
    rng = np.random.default_rng(1)
    sigma, T = 2.0, 20
    others = rng.integers(0, 50, size=T).astype(float)
    gains = [posterior_confidence(0.5, others + 1 + rng.normal(0, sigma, T), others, sigma)[-1] for _ in range(4000)]
    # when f(d_i) = 1 each answer adds (2(a - c) - 1) / (2 σ²), mean 1/(2σ²)
    assert np.mean(gains) == pytest.approx(T / (2 * sigma**2), rel=0.05)
    with pytest.raises(ConfigError):
        conf(1.0)
    with pytest.raises(DataError):
        posterior_confidence(0.5, [1.0, 2.0], [1.0], 1.0)
    with pytest.raises(DataError, match="0/1"):
        SuLQ([np.arange(5)], sigma=1.0, random_state=0).query(lambda r: r)
