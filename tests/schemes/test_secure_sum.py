import numpy as np
import pytest
import torch

from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import Seeds
from dpfl.schemes.base import RoundContext
from dpfl.schemes.secure_sum import SecAggTransport
from dpfl.secagg import ring
from dpfl.secagg.protocol import RoundAborted


def _ctx(k, d, rnd=1, seed=0):
    return RoundContext(
        round=rnd,
        n_params=d,
        cohort=np.arange(k),
        n_selected=k,
        weights=torch.ones(k),
        seeds=Seeds(seed),
        device=torch.device("cpu"),
        global_params=torch.zeros(d),
    )


def test_fixed_point_sum_of_noisy_rows():
    k, d, f = 12, 2000, 16
    S, share_std = 1.0, 0.2
    g = torch.Generator().manual_seed(0)
    u = torch.randn(k, d, generator=g)
    u = u / u.norm(dim=1, keepdim=True).clamp(min=S) + share_std * torch.randn(k, d, generator=g)
    c = ring.gaussian_clip_range(S, share_std, k * d)
    tr = SecAggTransport("fixed", clip_range=c, frac_bits=f)
    ctx = _ctx(k, d)
    rec = tr.transmit(u.clone(), ctx)  # transmit encodes float32 rows in their own memory
    assert tr.secure and rec.rows is None and rec.count == k
    err = (rec.total - u.double().sum(0)).abs().max().item()
    assert err < k * 2.0**-f  # each client's rounding error is below one unit
    b = ring.fixed_point_bits(c, f, k)
    assert ctx.metrics["secagg_bits"] == b
    assert (rec.upstream_bytes == 13 + -(-d * b // 8)).all()
    again = tr.transmit(u.clone(), _ctx(k, d))  # same seed: bit-identical
    assert torch.equal(rec.total, again.total)


def test_integer_rows_thesis_modulus_and_bits_per_parameter():
    n, sigma, K = 1_663_370, 1.54, 100
    b = ring.sign_dp_bits(n, sigma, K)
    assert b == 22
    k, d = 8, 4000  # a small cohort and vector; the modulus is the thesis's for setting B
    xi = np.sqrt(n) * sigma / np.sqrt(K)
    rng = np.random.default_rng(1)
    u = torch.from_numpy(np.sign(rng.standard_normal((k, d))) + np.rint(rng.normal(0, xi, (k, d))))
    rec = SecAggTransport("int", bits=b).transmit(u.to(torch.int64), _ctx(k, d))
    assert rec.total.dtype == torch.int64
    assert torch.equal(rec.total, u.to(torch.int64).sum(0))  # exact
    header = 13
    assert ((rec.upstream_bytes - header) * 8 / d == 22).all()  # measured payload: 22 bits per parameter


def test_dropouts_within_tolerance_complete_beyond_abort():
    k, d = 20, 100
    u = torch.randint(-50, 51, (k, d))
    ctx = _ctx(k, d, rnd=3)
    rec = SecAggTransport("int", bits=20, drop_after_masking=0.3, max_dropouts=6).transmit(u, ctx)
    dropped = ctx.numpy_rng("secagg-drop").choice(k, size=6, replace=False)
    keep = np.setdiff1d(np.arange(k), dropped)
    assert rec.count == 14 and torch.equal(rec.total, u[keep].sum(0))
    assert (rec.upstream_bytes[dropped] == 0).all() and (rec.upstream_bytes[keep] > 0).all()
    with pytest.raises(RoundAborted):  # noise calibrated for 5 failures: 6 drops must not release a sum
        SecAggTransport("int", bits=20, drop_after_masking=0.3, max_dropouts=5).transmit(u, _ctx(k, d, rnd=3))
    with pytest.raises(RoundAborted):  # the default tolerates no failure
        SecAggTransport("int", bits=20, drop_after_masking=0.1).transmit(u, _ctx(k, d, rnd=3))


def test_sparse_graph_transport():
    k, d = 30, 64
    u = torch.randint(-9, 10, (k, d))
    rec = SecAggTransport("int", bits=16, neighbours=6).transmit(u, _ctx(k, d))
    assert torch.equal(rec.total, u.sum(0))


def test_configuration_errors():
    with pytest.raises(ConfigError, match="clip_range"):
        SecAggTransport("fixed")
    with pytest.raises(ConfigError, match="bits"):
        SecAggTransport("int")
    with pytest.raises(ConfigError, match="encoding"):
        SecAggTransport("float")
    with pytest.raises(ConfigError, match="fraction"):
        SecAggTransport("int", bits=16, drop_after_masking=1.0)
    with pytest.raises(ConfigError, match="overflow"):
        SecAggTransport("fixed", clip_range=4.0, frac_bits=16, bits=20).transmit(
            torch.zeros(10, 3), _ctx(10, 3)
        )
    with pytest.raises(ProtocolError, match="outside the allowed range"):
        SecAggTransport("int", bits=8).transmit(torch.full((4, 3), 40), _ctx(4, 3))
