import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.compression.bits import (
    SignCodec,
    UIntCodec,
    pack_signs,
    pack_uint,
    packed_nbytes,
    random_sign,
    unpack_signs,
    unpack_uint,
)
from dpfl.errors import ConfigError, DataError, DpflError, ProtocolError


def reference_pack(values, bits):
    """Brute force: one Python integer per row, value i at bit offset i·bits."""
    out = []
    for row in values:
        acc = 0
        for i, v in enumerate(row):
            acc |= int(v) << (i * bits)
        nbytes = (len(row) * bits + 7) // 8
        out.append(np.frombuffer(acc.to_bytes(nbytes, "little"), dtype=np.uint8))
    return np.stack(out)


@pytest.mark.parametrize("bits", list(range(1, 65)))
def test_pack_uint_matches_bruteforce_and_round_trips(bits):
    rng = np.random.default_rng(bits)
    for d in (1, 7, 64 + 3):
        v = rng.integers(0, 2**bits, size=(3, d), dtype=np.uint64, endpoint=False) if bits < 64 else \
            rng.integers(0, 2**63, size=(3, d), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        v[0, 0] = (1 << bits) - 1  # extreme values
        v[1, -1] = 0
        packed = pack_uint(v, bits)
        assert packed.shape == (3, packed_nbytes(d, bits))
        np.testing.assert_array_equal(packed, reference_pack(v, bits))
        np.testing.assert_array_equal(unpack_uint(packed, d, bits), v)


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(1, 64), k=st.integers(1, 3), d=st.integers(1, 200), seed=st.integers(0, 2**32 - 1))
def test_pack_uint_round_trip_property(bits, k, d, seed):
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 2 ** min(bits, 63), size=(k, d), dtype=np.int64)
    np.testing.assert_array_equal(unpack_uint(pack_uint(v, bits), d, bits).view(np.int64), v)


def test_sign_packing_is_one_bit_per_value_and_matches_uint1():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1001)).astype(np.float32)
    packed = pack_signs(x)
    assert packed.shape == (4, 126)  # ceil(1001 / 8)
    np.testing.assert_array_equal(packed, pack_uint((x > 0).astype(np.uint64), 1))
    np.testing.assert_array_equal(unpack_signs(packed, 1001), np.where(x > 0, 1, -1))


def test_exact_zeros_get_fair_reproducible_random_signs():
    x = np.zeros((2, 20000), dtype=np.float32)
    x[0, :5] = [1, -1, 2, -3, 0.5]
    a = random_sign(x, np.random.default_rng(7))
    b = random_sign(x, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[0, :5], [1, -1, 1, -1, 1])
    assert set(np.unique(a)) == {-1, 1}
    zeros = a[x == 0]
    # 39,995 fair coin flips: mean within 5 standard deviations of 0
    assert abs(zeros.mean()) < 5 / np.sqrt(zeros.size)
    with pytest.raises(ConfigError, match="Generator"):
        random_sign(x)
    with pytest.raises(DataError, match="NaN"):
        random_sign(np.array([[np.nan, 1.0]]), np.random.default_rng(0))


@settings(max_examples=40, deadline=None)
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 3000)), zeros=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_random_sign_is_numpys_sign_with_zeros_filled_in_order(shape, zeros, seed):
    """Against a plain reference: sign, then the zeros in row-major order take
    2·integers(0, 2) − 1 from the same generator, which ends in the same state."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape).astype(np.float32)
    x[g.random(shape) < zeros] = 0.0
    got_rng, ref_rng = np.random.default_rng(seed + 1), np.random.default_rng(seed + 1)
    got = random_sign(x, got_rng)
    ref = np.where(x > 0, 1, -1).astype(np.int8)
    nz = int((x == 0).sum())
    ref[x == 0] = 2 * ref_rng.integers(0, 2, size=nz, dtype=np.int8) - 1
    np.testing.assert_array_equal(got, ref)
    assert got_rng.integers(0, 2**62) == ref_rng.integers(0, 2**62)


def test_bad_inputs_raise_named_errors():
    with pytest.raises(ConfigError, match=r"\[1, 64\]"):
        pack_uint(np.zeros((1, 3), np.int64), 0)
    with pytest.raises(ConfigError, match=r"\[1, 64\]"):
        pack_uint(np.zeros((1, 3), np.int64), 65)
    with pytest.raises(DataError, match="negative"):
        pack_uint(np.array([[1, -2]]), 8)
    with pytest.raises(DataError, match=r"2\*\*3"):
        pack_uint(np.array([[8]]), 3)
    with pytest.raises(DataError, match="integer"):
        pack_uint(np.array([[1.0]]), 8)
    good = pack_uint(np.array([[5, 6, 7]]), 3)  # 9 bits -> 2 bytes, 7 padding bits
    with pytest.raises(ProtocolError, match="padding"):
        unpack_uint(good | np.array([[0, 0x80]], np.uint8), 3, 3)
    with pytest.raises(ProtocolError, match=r"uint8 \[k, 2\]"):
        unpack_uint(good[:, :1], 3, 3)
    with pytest.raises(ProtocolError, match="padding"):
        unpack_signs(np.array([[0xFF]], np.uint8), 5)
    assert issubclass(ProtocolError, DpflError)


def test_codecs_count_exact_wire_bytes():
    rng = np.random.default_rng(1)
    rows = torch.from_numpy(rng.standard_normal((5, 1663)).astype(np.float32))
    p = SignCodec().encode(rows)
    assert p.per_client_nbytes().tolist() == [208] * 5  # ceil(1663 / 8)
    assert torch.equal(SignCodec().decode(p, 1663), torch.where(rows > 0, 1, -1).to(torch.int8))
    ints = torch.from_numpy(rng.integers(0, 2**22, size=(5, 1663)))
    c = UIntCodec(22)
    q = c.encode(ints)
    assert q.per_client_nbytes().tolist() == [(1663 * 22 + 7) // 8] * 5
    assert torch.equal(c.decode(q, 1663), ints)
    neg = torch.tensor([[-1, -(2**63), 2**63 - 1, 0]])  # bits=64: two's complement residues
    assert torch.equal(UIntCodec(64).decode(UIntCodec(64).encode(neg), 4), neg)
    with pytest.raises(DataError, match="integer tensor"):
        c.encode(rows)


def test_random_sign_rows_and_sign_codec_fast_paths_equal_the_numpy_reference():
    """The torch paths (rows without zeros skip the generator) give the bytes and signs of
    `random_sign` / `pack_signs` row by row, with zeros, integers and NaN handled alike."""
    import torch

    from dpfl.compression.bits import SignCodec, random_sign_rows
    from dpfl.schemes.transport import sum_rows

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 1001, generator=g)
    x[2, ::7] = 0.0
    x[5, 3] = 0.0
    ref = np.concatenate([random_sign(x[i : i + 1].numpy(), np.random.default_rng(i)) for i in range(6)])
    got = random_sign_rows(x, lambda i: np.random.default_rng(i))
    assert np.array_equal(got.numpy(), ref)
    used = []
    random_sign_rows(x, lambda i: used.append(i) or np.random.default_rng(i))
    assert used == [2, 5]
    codec = SignCodec()
    for rows in (x, got, x.to(torch.int32)):
        fast = codec.encode(rows, np.random.default_rng(9)).arrays["signs"]
        assert np.array_equal(fast, pack_signs(rows.numpy(), np.random.default_rng(9)))
    assert torch.equal(sum_rows(got), got.sum(0))
    bad = x.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        random_sign_rows(bad, lambda i: np.random.default_rng(i))
    infs = x.clone()  # +inf and -inf make the NaN pre-check's sum NaN: not a NaN input
    infs[4, :2] = torch.tensor([float("inf"), float("-inf")])
    ref = np.concatenate([random_sign(infs[i : i + 1].numpy(), np.random.default_rng(i)) for i in range(6)])
    assert np.array_equal(random_sign_rows(infs, lambda i: np.random.default_rng(i)).numpy(), ref)
    infs[4, 5] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        random_sign_rows(infs, lambda i: np.random.default_rng(i))
    with pytest.raises(DataError, match="NaN"):
        codec.encode(bad, np.random.default_rng(0))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), before=st.integers(0, 9), counts=st.lists(st.integers(0, 70), max_size=4))
def test_random_signs_equal_numpy_integers_draw_for_draw(seed, before, counts):
    """The raw-word fast path gives exactly `2·integers(0, 2, int8) − 1` and leaves the generator
    in the same state (a pending half word included), so later draws agree too."""
    from dpfl.compression.bits import random_signs

    for make in (np.random.default_rng, lambda s: np.random.Generator(np.random.Philox(s))):
        ref, fast = make(seed), make(seed)
        ref.integers(0, 2, size=before, dtype=np.int8)  # odd sizes leave a buffered half word
        fast.integers(0, 2, size=before, dtype=np.int8)
        for c in counts + [1, 4097]:
            want = (ref.integers(0, 2, size=c, dtype=np.int8) << 1) - np.int8(1)
            got = random_signs(fast, c)
            assert got.dtype == np.int8 and np.array_equal(got, want)
            assert repr(fast.bit_generator.state) == repr(ref.bit_generator.state)
        assert fast.integers(0, 2**32) == ref.integers(0, 2**32)


_SPECIAL = [0.0, -0.0, 1.0, -1.0, 1e-45, -3.4e38, 3.4e38, float("inf"), float("-inf")]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from(_SPECIAL), min_size=1, max_size=40), min_size=1, max_size=5),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32]),
       transpose=st.booleans(), nan=st.booleans())
def test_random_sign_rows_and_sign_codec_equal_the_reference_on_any_dtype_and_layout(rows, dtype, transpose, nan):
    """Row by row through NumPy (zeros by boolean assignment, NaN by a sum pre-check), whatever the dtype
    (bfloat16 as float32) and strides: the signs `random_sign` gives each row, the bytes of `pack_signs`,
    and NaN refused; extreme values whose sums overflow are not taken for NaN."""
    from dpfl.compression.bits import random_sign_rows

    width = min(len(r) for r in rows)
    x = torch.tensor([r[:width] for r in rows], dtype=torch.float64)
    if dtype == torch.int32:
        x = torch.where(torch.isfinite(x), x.clamp(-1e9, 1e9), torch.zeros_like(x))
    x = x.to(dtype)
    if transpose:  # a non-contiguous view of the same values
        x = x.t().contiguous().t()
        assert not x.is_contiguous() or x.shape[0] == 1 or x.shape[1] == 1
    if nan and dtype != torch.int32:
        x[-1, -1] = float("nan")
        with pytest.raises(DataError, match="NaN"):
            random_sign_rows(x, lambda i: np.random.default_rng(i))
        with pytest.raises(DataError, match="NaN"):
            SignCodec().encode(x, np.random.default_rng(0))
        return
    ref_in = x.float().numpy() if dtype == torch.bfloat16 else x.numpy()
    ref = np.concatenate([random_sign(ref_in[i : i + 1], np.random.default_rng(i)) for i in range(len(x))])
    assert np.array_equal(random_sign_rows(x, lambda i: np.random.default_rng(i)).numpy(), ref)
    fast = SignCodec().encode(x, np.random.default_rng(5)).arrays["signs"]
    assert np.array_equal(fast, pack_signs(ref_in, np.random.default_rng(5)))
