import numpy as np
import pytest
import torch
from sklearn.linear_model import Lasso

from dpfl.compression.cs import CHECK_EVERY, bpdn, objective
from dpfl.compression.dct import ChunkedDCT
from dpfl.errors import ConfigError


def theta_of(op):
    return op.compress(torch.eye(op.n, dtype=torch.float64)).T.numpy()  # [m, n], padding columns excluded


def sklearn_lasso(theta, y, lam):
    # sklearn minimises 1/(2m)‖y − Θs‖² + α‖s‖₁, i.e. ours divided by m with α = λ/m
    m = theta.shape[0]
    return Lasso(alpha=lam / m, fit_intercept=False, tol=1e-12, max_iter=200_000).fit(theta, y).coef_


@pytest.mark.parametrize("n,m,p", [(240, 60, 3), (307, 90, 4)])  # 307: with a padding slot
def test_bpdn_matches_independent_lasso_solver(n, m, p):
    rng = np.random.default_rng(n)
    op = ChunkedDCT(n, m, p, rng.permutation(n))
    x = np.zeros(n)
    x[rng.choice(n, 8, replace=False)] = rng.standard_normal(8)
    y = op.compress(torch.from_numpy(x))
    lam = 1e-2
    s, info = bpdn(op, y, lam, tol=1e-10, max_iter=20_000)
    assert info.converged
    ref = sklearn_lasso(theta_of(op), y.numpy(), lam)
    f = float(objective(op, y, s, lam))
    f_ref = float(objective(op, y, torch.from_numpy(ref), lam))
    assert f <= f_ref * (1 + 1e-7)
    np.testing.assert_allclose(s.numpy(), ref, atol=1e-5)


def test_bpdn_kkt_conditions_and_batching():
    n, m, p, lam = 200, 60, 2, 1e-3
    rng = np.random.default_rng(1)
    op = ChunkedDCT(n, m, p, rng.permutation(n))
    x = np.zeros((2, n))
    x[:, rng.choice(n, 10, replace=False)] = rng.standard_normal((2, 10)) * 0.1
    y = op.compress(torch.from_numpy(x)) + torch.from_numpy(rng.standard_normal((2, m)) * 1e-3)
    s, info = bpdn(op, y, lam, tol=1e-10, max_iter=20_000)
    assert info.converged and s.shape == (2, n)
    theta = theta_of(op)
    for b in range(2):
        g = theta.T @ (y[b].numpy() - theta @ s[b].numpy())  # −∇ of the smooth part
        nz = s[b].numpy() != 0
        np.testing.assert_allclose(g[nz], lam * np.sign(s[b].numpy()[nz]), atol=1e-7)
        assert np.all(np.abs(g[~nz]) <= lam + 1e-7)
    single, _ = bpdn(op, y[1], lam, tol=1e-10, max_iter=20_000)
    np.testing.assert_allclose(single.numpy(), s[1].numpy(), atol=1e-8)


def test_sparse_signal_is_recovered_at_the_thesis_lambda():
    n, p = 4096, 4
    rng = np.random.default_rng(2)
    op = ChunkedDCT(n, n // 2, p, rng.permutation(n))  # r = 0.5
    x = np.zeros(n)
    x[rng.choice(n, 20, replace=False)] = rng.choice([-1, 1], 20) * (0.01 + rng.random(20) * 0.01)
    x = torch.from_numpy(x).float()
    s, info = bpdn(op, op.compress(x), 1e-5)
    assert info.converged
    assert float((s - x).norm() / x.norm()) < 0.05


def test_zero_measurements_give_zero():
    op = ChunkedDCT(100, 10, 2, None)
    s, info = bpdn(op, torch.zeros(10), 1e-5)
    assert info.converged and info.iterations == CHECK_EVERY and torch.all(s == 0)


def test_bad_solver_options():
    op = ChunkedDCT(100, 10, 2, None)
    y = torch.ones(10)
    with pytest.raises(ConfigError, match="lambda"):
        bpdn(op, y, 0.0)
    with pytest.raises(ConfigError, match="max_iter"):
        bpdn(op, y, max_iter=0)
    with pytest.raises(ConfigError, match="tol"):
        bpdn(op, y, tol=0)
    with pytest.raises(ConfigError, match=r"\(0, 2\)"):
        bpdn(op, y, relax=2.0)
