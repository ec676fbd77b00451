import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.errors import ConfigError, DpflError, ProtocolError
from dpfl.secagg import ring


@pytest.mark.parametrize("sigma,expected", [(1.54, 22), (1.08, 21), (0.81, 21)])
def test_thesis_sign_dp_bits(sigma, expected):
    # thesis Tables 5.1/5.2: 22 / 21 / 21 bits per parameter at eps = 1 / 2 / 4 (n = 1,663,370, |K| = 100)
    assert ring.sign_dp_bits(1_663_370, sigma, 100) == expected


def test_thesis_example_sigma_one():
    # §5.2.4 example: |K| = 100, max|mu| = 1, sigma = 1 -> log2 m = 22 (with that paragraph's n = 10^7)
    assert ring.sign_dp_bits(10**7, 1.0, 100) == 22


def test_bits_for_bound_is_minimal_and_safe():
    for bound in range(40):
        for k in range(1, 9):
            b = ring.bits_for_bound(bound, k)
            assert k * bound <= 2 ** (b - 1) - 1
            if b > 1:
                assert k * bound > 2 ** (b - 2) - 1  # one bit fewer would not do


def test_bits_above_64_raise():
    with pytest.raises(ConfigError, match="64"):
        ring.bits_for_bound(2**62, 4)
    with pytest.raises(ConfigError, match="64"):
        ring.fixed_point_bits(1e6, 52, 100)
    with pytest.raises(ConfigError):
        ring.check_bits(65)


def test_centred_lift_brute_force():
    b = 5
    for v in range(-16, 16):
        w = np.array([v % 32], dtype=np.uint32)
        assert ring.centred_lift(w, b)[0] == v


def test_encode_int_sum_decodes_exactly_at_the_bound():
    b, k = 12, 7
    lim = ring.client_bound(b, k)
    for sign in (1, -1):
        rows = np.full((k, 50), sign * lim, dtype=np.int64)
        words = ring.encode_int(rows, b)
        s = ring.reduce(words.sum(axis=0, dtype=np.uint32), b)
        assert (ring.centred_lift(s, b) == sign * k * lim).all()
    # every mixture of extremes as well (brute force over 2^k sign patterns)
    pats = np.array(list(itertools.product([-lim, lim], repeat=k))).T  # [k, 2^k]
    words = ring.encode_int(pats, b)
    s = ring.reduce(words.sum(axis=0, dtype=np.uint32), b)
    assert (ring.centred_lift(s, b) == pats.sum(axis=0)).all()


def test_encode_int_rejects_out_of_range_and_non_integers():
    b, k = 10, 4
    lim = ring.client_bound(b, k)
    with pytest.raises(ProtocolError, match="outside the allowed range"):
        ring.encode_int(np.full((k, 3), lim + 1), b)
    with pytest.raises(ProtocolError, match="non-integral"):
        ring.encode_int(np.full((k, 3), 0.5), b)
    with pytest.raises(ConfigError, match="overflow"):
        ring.encode_int(np.zeros((k, 3), dtype=np.int64), b, bound=lim + 1)
    # integral floats and torch ints are accepted
    t = torch.tensor([[3, -2], [1, 0]])
    assert np.array_equal(ring.centred_lift(ring.encode_int(t, 8), 8), t.numpy())


@pytest.mark.parametrize("d", [777, 2 * (1 << 14) + 5])  # one chunk; chunk edges and a short tail
def test_encode_fixed_words_are_the_stochastic_rounding_of_the_scaled_rows(d):
    f, c, k = 12, 3.0, 3
    b = ring.fixed_point_bits(c, f, k)
    x = np.random.default_rng(2).uniform(-c, c, size=(k, d)).astype(np.float32)
    rng = np.random.default_rng(9)
    ref = []
    for row in x:  # reference: q = ⌊x·2^f⌋ + [U < frac], U drawn row by row
        y = row.astype(np.float64) * 2.0**f
        ref.append((np.floor(y) + (rng.random(row.size) < y - np.floor(y))).astype(np.int64))
    words = ring.encode_fixed(x, b, c, f, np.random.default_rng(9))
    assert np.array_equal(ring.centred_lift(words, b), np.array(ref))


def test_encode_fixed_in_place_gives_the_same_words_in_the_rows_memory():
    f, c, k = 12, 3.0, 4
    b = ring.fixed_point_bits(c, f, k)
    x = np.random.default_rng(1).uniform(-c, c, size=(k, 5003)).astype(np.float32)
    ref = ring.encode_fixed(x, b, c, f, np.random.default_rng(7))
    mine = x.copy()
    words = ring.encode_fixed(mine, b, c, f, np.random.default_rng(7), inplace=True)
    assert np.shares_memory(words, mine) and np.array_equal(words, ref)
    bad = x.copy()
    bad[3, 9] = 2 * c
    kept = bad.copy()
    with pytest.raises(ProtocolError, match="clip range"):
        ring.encode_fixed(bad, b, c, f, np.random.default_rng(7), inplace=True)
    assert np.array_equal(bad, kept)
    wide = x.astype(np.float64)  # not the word's width (b ≤ 32: uint32): new memory
    assert not np.shares_memory(ring.encode_fixed(wide, b, c, f, np.random.default_rng(7), inplace=True), wide)


def test_int_range_matches_numpy():
    rng = np.random.default_rng(4)
    for dtype in (np.int32, np.int64, np.uint32, np.uint64):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=(3, 4099), dtype=dtype, endpoint=True)
        x[1, 5], x[2, 9] = info.min, info.max
        assert ring.int_range(x) == (int(x.min()), int(x.max()))


def test_fixed_point_round_trip_on_grid_is_exact():
    f, c, k = 10, 3.0, 5
    rng = np.random.default_rng(0)
    x = rng.integers(-3 * 2**f, 3 * 2**f + 1, size=(k, 200)) / 2**f  # values on the 2^-f grid
    b = ring.fixed_point_bits(c, f, k)
    words = ring.encode_fixed(x, b, c, f, rng)
    assert np.array_equal(ring.decode_fixed(words[0], b, f), x[0])
    s = ring.reduce(words.sum(axis=0, dtype=ring.word_dtype(b)), b)
    assert np.array_equal(ring.decode_fixed(s, b, f), x.sum(axis=0))


def test_fixed_point_no_overflow_at_the_clip_range():
    f, c, k = 8, 2.5, 9
    b = ring.fixed_point_bits(c, f, k)
    for sign in (1.0, -1.0):
        x = np.full((k, 10), sign * c)
        w = ring.encode_fixed(x, b, c, f, np.random.default_rng(1))
        s = ring.reduce(w.sum(axis=0, dtype=ring.word_dtype(b)), b)
        assert np.allclose(ring.decode_fixed(s, b, f), sign * k * c)
    with pytest.raises(ConfigError, match="cannot hold"):
        ring.encode_fixed(np.zeros((k, 2)), b - 1, c, f, np.random.default_rng(1))
    with pytest.raises(ProtocolError, match="outside the clip range"):
        ring.encode_fixed(np.full((k, 2), c * 1.01), b, c, f, np.random.default_rng(1))
    with pytest.raises(ProtocolError, match="NaN"):
        ring.encode_fixed(np.full((k, 2), np.nan), b, c, f, np.random.default_rng(1))


def test_stochastic_rounding_error_and_unbiasedness():
    f, c = 4, 1.0
    b = ring.fixed_point_bits(c, f, 3)
    x = np.full((1, 200_000), 0.3 / 2**f)  # 0.3 of a unit: rounds up with probability 0.3
    words = ring.encode_fixed(x, b, c, f, np.random.default_rng(2))
    dec = ring.decode_fixed(words[0], b, f)
    assert set(np.unique(dec)) <= {0.0, 1 / 2**f}
    ups = int((dec > 0).sum())
    assert stats.binomtest(ups, x.size, 0.3).pvalue > 1e-3
    # the same generator state gives the same words
    again = ring.encode_fixed(x, b, c, f, np.random.default_rng(2))
    assert np.array_equal(words, again)
    # errors are below one unit for arbitrary reals
    y = np.random.default_rng(3).uniform(-1, 1, size=(3, 1000))
    w = ring.encode_fixed(y, b, c, f, np.random.default_rng(4))
    assert np.abs(ring.decode_fixed(w[1], b, f) - y[1]).max() < 1 / 2**f


def test_gaussian_clip_range_matches_scipy_tail():
    S, s, n = 2.0, 0.3, 10**6
    c = ring.gaussian_clip_range(S, s, n, log2_fail=40)
    t = (c - S) / s
    assert n * 2 * stats.norm.sf(t) <= 2.0**-40
    assert n * 2 * stats.norm.sf(t * 0.9) > 2.0**-40  # not wastefully loose


def test_errors_are_dpfl_errors():
    with pytest.raises(DpflError):
        ring.sign_dp_bits(10, -1.0, 5)
    with pytest.raises(DpflError):
        ring.fixed_point_bound(math.inf, 3)
