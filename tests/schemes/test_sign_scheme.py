import numpy as np
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
