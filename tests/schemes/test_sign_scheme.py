import numpy as np
import pytest
import torch

from dpfl.compression.bits import SignCodec
from dpfl.schemes.aggregators import SumAggregator
from dpfl.schemes.sign import SignStep
from dpfl.schemes.transport import PlainTransport


def test_fl_sign_round_is_a_majority_vote_with_one_bit_per_parameter(contexts):
    n, k = 1001, 5
    sctx, rctx = contexts(n)
    step, transport = SignStep(gamma=0.001), PlainTransport(SignCodec())
    step.setup(sctx)
    ctx = rctx(1, k)
    u = torch.randn(k, n)
    u[0, :10] = 0.0  # exact zeros get random signs
    s = step.client(u, ctx)
    assert s.dtype == torch.int8 and set(s.unique().tolist()) == {-1, 1}
    assert torch.equal(s[:, 10:], torch.where(u[:, 10:] > 0, 1, -1).to(torch.int8))
    rec = transport.transmit(s, ctx)
    assert rec.upstream_bytes.tolist() == [126] * k  # ceil(1001 / 8): 1 bit per parameter
    assert torch.equal(rec.rows, s)
    delta = step.server(SumAggregator()(rec, ctx), ctx)
    votes = s.to(torch.int64).sum(0)  # k odd: no ties, brute-force majority
    assert torch.equal(delta, 0.001 * torch.where(votes > 0, 1.0, -1.0))
    assert step.downstream_bytes(ctx) is None  # FL-SIGN: full model downstream (engine default)


def test_server_ties_get_random_signs_and_signsgd_downstream_is_one_bit(contexts):
    n = 4000
    sctx, rctx = contexts(n)
    step = SignStep(gamma=0.002, one_bit_downstream=True)
    step.setup(sctx)
    ctx = rctx(3, 2)
    delta = step.server(torch.zeros(n), ctx)  # every coordinate tied
    assert set((delta / 0.002).round().unique().tolist()) == {-1.0, 1.0}
    assert abs(float(delta.sign().mean())) < 5 / np.sqrt(n)
    assert torch.equal(delta, step.server(torch.zeros(n), rctx(3, 2)))  # reproducible per round
    assert step.downstream_bytes(ctx) == 500  # the vote: n bits


@pytest.mark.parametrize("dtype,low,high", [(torch.int8, -128, 127), (torch.int16, -(2**15), 2**15 - 1),
                                            (torch.int32, -(2**31), 2**31 - 1)])
def test_sum_rows_is_exact_at_the_extremes_across_column_blocks(dtype, low, high):
    """The int32 block accumulator of int8/int16 rows (and int64 sums of int32 rows) is exact with every
    value at its extreme, over more columns than one block and a last partial block."""
    from dpfl.schemes.transport import _COLUMNS, sum_rows

    n, k = 2 * _COLUMNS + 3, 300
    rows = torch.full((k, n), low, dtype=dtype)
    rows[::2] = high
    rows[:, -1] = low
    want = rows.to(torch.int64).sum(0)
    got = sum_rows(rows)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert torch.equal(sum_rows(rows[:, ::2]), want[::2])  # strided columns
    assert torch.equal(sum_rows(rows[:0]), torch.zeros(n, dtype=torch.int64))
