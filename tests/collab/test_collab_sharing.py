"""Additive secret sharing over Z_(2^64): correctness, uniformity of K−1 shares, secure sums."""

import itertools

import numpy as np
import pytest
from scipy import stats

from dpfl.collab.sharing import decode, encode, reconstruct, secure_sum, share
from dpfl.errors import ConfigError, ProtocolError
from dpfl.rng import Seeds

U64 = 2**64


def test_shares_sum_to_the_secret_mod_the_ring():
    rng = Seeds(0).crypto("t")
    x = rng.uint64(50)
    for k in (2, 3, 7):
        s = share(x, k, rng)
        assert s.shape == (k, 50) and s.dtype == np.uint64
        assert np.array_equal(reconstruct(s), x)
        # independent reference: Python integers mod 2^64
        assert [sum(int(v) for v in s[:, j]) % U64 for j in range(50)] == [int(v) for v in x]


def test_share_wise_addition_is_the_sum():
    rng = Seeds(1).crypto("t")
    a, b = encode(np.array([1.25, -3.5, 1e3]), 20), encode(np.array([-0.75, -1.0, 2.5]), 20)
    sa, sb = share(a, 4, rng), share(b, 4, rng)
    assert np.allclose(decode(reconstruct(sa + sb), 20), [0.5, -4.5, 1002.5])


def test_fixed_point_encoding():
    v = np.array([0.0, 1e-9, -2.5, 3.14159265, -1e6])
    for f in (16, 24, 32):
        assert np.all(np.abs(decode(encode(v, f), f) - v) <= 2.0 ** -(f + 1))
    assert int(encode(np.array([-1.0]), 0)[0]) == U64 - 1  # two's complement
    with pytest.raises(ProtocolError, match="too large"):
        encode(np.array([2.0**40]), 24)
    with pytest.raises(ProtocolError, match="NaN"):
        encode(np.array([np.nan]), 24)
    with pytest.raises(ConfigError):
        encode(np.array([1.0]), 60)
    with pytest.raises(ConfigError):
        share(np.zeros(2, np.uint64), 1, Seeds(0).crypto("t"))


@pytest.mark.parametrize("secret", [0, 2**63 + 12345])
def test_any_k_minus_1_shares_look_uniform(secret):
    k, n = 3, 6000
    rng = Seeds(2).crypto("uniform", secret)
    s = share(np.full(n, secret, dtype=np.uint64), k, rng)  # [k, n]
    for subset in itertools.combinations(range(k), k - 1):  # includes the derived last share
        top = [(s[i] >> np.uint64(60)).astype(np.int64) for i in subset]  # 16 cells each
        for t in top:
            assert stats.chisquare(np.bincount(t, minlength=16)).pvalue > 1e-4
        joint = top[0] * 16 + top[1]  # pairs: 256 cells, tests independence too
        assert stats.chisquare(np.bincount(joint, minlength=256)).pvalue > 1e-4
        low = (s[subset[-1]] & np.uint64(0xFF)).astype(np.int64)
        assert stats.chisquare(np.bincount(low, minlength=256)).pvalue > 1e-4
    # the derived share's distribution does not depend on the secret
    other = share(np.full(n, 7, dtype=np.uint64), k, Seeds(3).crypto("uniform"))
    assert (
        stats.ks_2samp(
            (s[-1] >> np.uint64(11)).astype(float), (other[-1] >> np.uint64(11)).astype(float)
        ).pvalue
        > 1e-4
    )


def test_secure_sum_equals_the_plain_sum_and_counts_traffic():
    rng = Seeds(4).crypto("sum")
    vals = np.random.default_rng(0).normal(size=(5, 1000))
    total, t = secure_sum(vals, 24, rng)
    assert np.all(np.abs(total - vals.sum(0)) <= 5 * 2.0**-25)
    assert (t.peer_messages, t.peer_bytes) == (20, 20 * 8000)
    assert (t.upload_messages, t.upload_bytes) == (5, 5 * 8000)
    scalar, ts = secure_sum(np.array([0.5, -1.25, 2.0]), 24, rng)
    assert scalar == 1.25 and (ts.peer_messages, ts.peer_bytes, ts.upload_bytes) == (6, 48, 24)
    with pytest.raises(ConfigError):
        secure_sum(np.array([1.0]), 24, rng)
