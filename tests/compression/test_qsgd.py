"""QSGD quantizer and codec: unbiased, within the paper's variance bound, exact on the wire."""

import numpy as np
import pytest
import torch

from dpfl.compression.base import Payload
from dpfl.compression.qsgd import QSGDCodec, dequantize, level_bits, n_buckets, n_values, quantize
from dpfl.errors import ConfigError, DataError, ProtocolError


def _q(msg, n, s, b):
    nb = n_buckets(n, b)
    return dequantize(msg[None, :nb], msg[None, nb:], s, b)[0].astype(np.float64)


@pytest.mark.parametrize("s, b", [(1, 16), (4, 64), (15, 40)])
def test_quantizer_is_unbiased_within_its_variance_bound(s, b):
    n, draws = 64, 2000
    v = np.random.default_rng(1).normal(size=n) * np.linspace(0.1, 3, n)
    rng = np.random.default_rng(2)
    q = np.stack([_q(quantize(v, s, b, rng), n, s, b) for _ in range(draws)])
    # per coordinate Var Q_i ≤ ‖v_b‖²/(4s²): the mean of `draws` draws is within 5 std of v
    norms = np.repeat([np.linalg.norm(v[i : i + b]) for i in range(0, n, b)], b)[:n]
    assert np.all(np.abs(q.mean(0) - v) <= 5 * norms / (2 * s * np.sqrt(draws)))
    # Lemma 3.1: E‖Q(v_b) − v_b‖² ≤ min(B/s², √B/s)·‖v_b‖² (summed over buckets; 5% sampling slack)
    bound = sum(min(len(v[i : i + b]) / s**2, np.sqrt(len(v[i : i + b])) / s) * np.sum(v[i : i + b] ** 2)
                for i in range(0, n, b))
    assert ((q - v) ** 2).sum(1).mean() <= 1.05 * bound


def test_deterministic_rounding_would_fail_the_unbiasedness_check():
    v = np.full(8, 0.3)  # |v_i|/‖v‖ = 0.3/√(8·0.09) ≈ 0.354: s = 1 rounds it to 0 or 1/1
    q = np.stack([_q(quantize(v, 1, 8, np.random.default_rng(i)), 8, 1, 8) for i in range(1000)])
    assert abs(q.mean() - 0.3) < 0.05  # std of the mean of 8000 draws: 0.005 and set(np.unique(np.abs(q).round(6))) == {0.0, round(np.sqrt(0.72), 6)}


def test_same_generator_state_same_message():
    v = np.random.default_rng(0).normal(size=100)
    a, b = (quantize(v, 7, 32, np.random.default_rng(9)) for _ in range(2))
    assert np.array_equal(a, b)


@pytest.mark.parametrize("n, s, b", [(1, 1, 1), (100, 15, 512), (1000, 255, 64), (777, 3, 100)])
def test_codec_round_trips_and_its_bytes_are_the_packing(n, s, b):
    rng = np.random.default_rng(n)
    rows = np.stack([quantize(rng.normal(size=n), s, b, rng) for _ in range(3)])
    rows[1] = quantize(np.zeros(n), s, b, rng)  # zero row: norm 0, every level 0
    codec = QSGDCodec(s, b)
    payload = codec.encode(torch.from_numpy(rows), rng)
    expect = 4 * -(-n // b) + -(-n // 8) + -(-n * level_bits(s) // 8)
    assert list(payload.per_client_nbytes()) == [expect] * 3 == [codec.nbytes(n)] * 3
    out = codec.decode(payload, rows.shape[1]).numpy()
    nb = n_buckets(n, b)
    assert np.array_equal(out, dequantize(rows[:, :nb], rows[:, nb:], s, b)) and not out[1].any()


def test_level_bits_and_widths():
    assert [level_bits(s) for s in (1, 2, 3, 15, 16, 255, 256)] == [1, 2, 2, 4, 5, 8, 9]
    assert all(n_values(n + n_buckets(n, 7), 7) == n for n in range(60))
    assert n_values(8, 7) == 7
    with pytest.raises(ProtocolError, match="width"):
        n_values(9, 7)  # 7 values take 7 + 1, 8 values take 8 + 2


def test_codec_rejects_bad_payloads_and_bad_messages():
    codec = QSGDCodec(4, 4)  # 3 bits per level: 5..7 are on the wire but not levels
    msg = quantize(np.arange(1.0, 9.0), 4, 4, np.random.default_rng(0))
    p = codec.encode(torch.from_numpy(msg[None]))
    bad_level = Payload(dict(p.arrays, levels=np.full_like(p.arrays["levels"], 0xFF)))
    with pytest.raises(ProtocolError, match="exceeds s = 4"):
        codec.decode(bad_level, msg.size)
    with pytest.raises(ProtocolError, match="norms"):
        codec.decode(Payload(dict(p.arrays, norms=-p.arrays["norms"] - 1)), msg.size)
    with pytest.raises(ProtocolError, match="exactly"):
        codec.decode(Payload({"norms": p.arrays["norms"]}), msg.size)
    with pytest.raises(ProtocolError, match="signs"):
        codec.decode(Payload(dict(p.arrays, signs=p.arrays["signs"][:, :0])), msg.size)
    with pytest.raises(DataError, match="levels"):
        codec.encode(torch.from_numpy(np.concatenate([msg[:2], msg[2:] + 0.5])[None]))
    with pytest.raises(DataError, match="finite"):
        quantize(np.array([1.0, np.nan]), 3, 4, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="levels"):
        QSGDCodec(0, 4)
